from django.db import models

from tuneplane.models import Project, slug_validator

from .choices import FleetDelivery, FleetKind, FleetState, FleetVisibility


class Fleet(models.Model):
    """A named set of machines and the backend that runs work on them.

    A record an administrator creates, never a setting: nothing creates one on
    its own (F6). ``kind`` and ``delivery`` are fixed at creation (F1).
    """

    id = models.CharField(primary_key=True, max_length=63, validators=[slug_validator])
    kind = models.CharField(max_length=16, choices=FleetKind.choices)
    delivery = models.CharField(max_length=16, choices=FleetDelivery.choices)
    # A sorted list of FleetCapability values; JSON so SQLite and PostgreSQL read it alike.
    capabilities = models.JSONField(default=list, blank=True)
    visibility = models.CharField(
        max_length=16, choices=FleetVisibility.choices, default=FleetVisibility.PUBLIC
    )
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.PROTECT, related_name="fleets"
    )
    state = models.CharField(max_length=16, choices=FleetState.choices, default=FleetState.ACTIVE)
    config = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                name="fleet_project_iff_project_visibility",
                violation_error_message="A project Fleet names its project; a public one none.",
                condition=(
                    models.Q(visibility=FleetVisibility.PROJECT, project__isnull=False)
                    | models.Q(visibility=FleetVisibility.PUBLIC, project__isnull=True)
                ),
            ),
            models.CheckConstraint(
                name="fleet_kind_valid", condition=models.Q(kind__in=FleetKind.values)
            ),
            models.CheckConstraint(
                name="fleet_delivery_valid", condition=models.Q(delivery__in=FleetDelivery.values)
            ),
            models.CheckConstraint(
                name="fleet_state_valid", condition=models.Q(state__in=FleetState.values)
            ),
        ]

    def __str__(self) -> str:
        return self.id

    def snapshot(self) -> dict:
        """The Fleet as the audit log keeps it before and after a change."""
        return {
            "id": self.id,
            "kind": self.kind,
            "delivery": self.delivery,
            "capabilities": list(self.capabilities),
            "visibility": self.visibility,
            "project": self.project.slug if self.project_id else None,
            "state": self.state,
            "config": self.config,
        }
