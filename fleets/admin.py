from django import forms
from django.contrib import admin, messages
from django.http import HttpResponseRedirect
from django.urls import reverse

from audit.services import Actor
from tuneplane.admin import StaffAdmin
from tuneplane.deployment_settings import check_config
from tuneplane.errors import ApplicationError, ValidationFailed

from . import rules, services
from .choices import FleetCapability, FleetDelivery, FleetState
from .deletion import deletion_blockers
from .models import Fleet
from .page import fleet_page_sections
from .selectors import fleet_config_warnings


class FleetForm(forms.ModelForm):
    capabilities = forms.MultipleChoiceField(
        choices=FleetCapability.choices,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="A capability is a promise: work needing one the Fleet lacks is refused.",
    )
    delivery = forms.ChoiceField(
        choices=[("", "Follows the kind")] + FleetDelivery.choices,
        required=False,
        help_text="node and slurm: shared-mount; kubernetes: object-pull. Fixed once created.",
    )
    config = forms.JSONField(
        required=False,
        widget=forms.Textarea(
            attrs={
                "rows": 8,
                "cols": 80,
                "class": "vLargeTextField",
                "style": "font-family: monospace",
            }
        ),
        help_text="Deployment settings this Fleet overrides, as a JSON object.",
    )

    class Meta:
        model = Fleet
        fields = [
            "id",
            "kind",
            "delivery",
            "capabilities",
            "visibility",
            "project",
            "state",
            "config",
        ]

    def clean(self):
        data = super().clean()
        kind = self.instance.kind if self.instance.kind else data.get("kind")
        try:
            if "capabilities" in data:
                data["capabilities"] = rules.normalize_capabilities(data["capabilities"])
            if "delivery" in self.fields and kind:
                data["delivery"] = rules.resolve_delivery(kind, data.get("delivery"))
            if data.get("config") is None:
                data["config"] = {}
            if kind:
                check_config(kind, data["config"])
            if "visibility" in data:
                rules.validate_visibility(data["visibility"], data.get("project"))
        except ValidationFailed as exc:
            field = (exc.field or "").split(".")[0]
            self.add_error(field if field in self.fields else None, exc.message)
        return data


@admin.register(Fleet)
class FleetAdmin(StaffAdmin):
    form = FleetForm
    list_display = [
        "id",
        "kind",
        "delivery",
        "capability_list",
        "visibility",
        "project",
        "state",
        "updated_at",
    ]
    list_filter = ["kind", "state", "visibility", "project"]
    search_fields = ["id"]
    actions = ["activate", "drain", "disable"]
    fieldsets = [
        (None, {"fields": ["id", "kind", "delivery", "capabilities"]}),
        ("Who may use it", {"fields": ["visibility", "project"]}),
        ("State", {"fields": ["state"]}),
        ("Configuration", {"fields": ["config"]}),
    ]

    def get_readonly_fields(self, request, obj=None):
        # F1: what the machines are and where jobs write never change.
        if obj is not None:
            return ["id", "kind", "delivery", "created_at", "updated_at"]
        return []

    def get_fieldsets(self, request, obj=None):
        if obj is None:
            return self.fieldsets
        return self.fieldsets + [("Record", {"fields": ["created_at", "updated_at"]})]

    @admin.display(description="capabilities")
    def capability_list(self, fleet: Fleet) -> str:
        return ", ".join(fleet.capabilities) or "—"

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, {**(extra_context or {}), "title": "Fleets"})

    def change_view(self, request, object_id, form_url="", extra_context=None):
        fleet = self.get_object(request, object_id)
        sections = fleet_page_sections(fleet) if fleet is not None else []
        return super().change_view(
            request, object_id, form_url, {**(extra_context or {}), "fleet_sections": sections}
        )

    def add_view(self, request, form_url="", extra_context=None):
        return super().add_view(request, form_url, {**(extra_context or {}), "title": "New fleet"})

    def save_model(self, request, obj, form, change):
        actor = Actor.of_user(request.user)
        data = form.cleaned_data
        if change:
            fleet = services.fleet_update(
                actor=actor,
                fleet=obj,
                capabilities=data["capabilities"],
                visibility=data["visibility"],
                project=data.get("project"),
                state=data["state"],
                config=data["config"],
            )
        else:
            fleet = services.fleet_create(
                actor=actor,
                id=data["id"],
                kind=data["kind"],
                delivery=data["delivery"],
                capabilities=data["capabilities"],
                visibility=data["visibility"],
                project=data.get("project"),
                state=data["state"],
                config=data["config"],
            )
        for warning in fleet_config_warnings(fleet):
            messages.warning(request, warning.message)

    def save_formset(self, request, form, formset, change):
        """A higher app's inline saves through its own services (each change audited)."""
        save = getattr(formset, "save_through_services", None)
        if save is None:
            super().save_formset(request, form, formset, change)
        else:
            save(request, form.instance)

    def get_actions(self, request):
        actions = super().get_actions(request)
        # Deletion goes one Fleet at a time through the F7 guard, never in bulk.
        actions.pop("delete_selected", None)
        return actions

    def delete_view(self, request, object_id, extra_context=None):
        fleet = self.get_object(request, object_id)
        if fleet is not None:
            blockers = deletion_blockers(fleet)
            if blockers:
                self.message_user(
                    request,
                    f"Fleet '{fleet.id}' cannot be deleted (rule F7): it still has "
                    f"{'; '.join(blockers)}.",
                    messages.ERROR,
                )
                return HttpResponseRedirect(reverse("admin:fleets_fleet_change", args=[fleet.pk]))
        return super().delete_view(request, object_id, extra_context)

    def get_deleted_objects(self, objs, request):
        """What goes with a Fleet (its join tokens) is the deletion service's to decide, under
        F7: read-only elsewhere in the admin, it is not a permission this page lacks."""
        deleted, counts, _, protected = super().get_deleted_objects(objs, request)
        return deleted, counts, set(), protected

    def delete_model(self, request, obj):
        services.fleet_delete(actor=Actor.of_user(request.user), fleet=obj)

    def _set_state(self, request, queryset, state: str) -> None:
        changed = []
        for fleet in queryset:
            try:
                services.fleet_set_state(
                    actor=Actor.of_user(request.user), fleet=fleet, state=state
                )
            except ApplicationError as exc:
                self.message_user(request, f"{fleet.id}: {exc.message}", messages.ERROR)
            else:
                changed.append(fleet.id)
        if changed:
            self.message_user(
                request,
                f"Now {state}: {', '.join(changed)}. Running work "
                "continues; only new work is affected.",
                messages.SUCCESS,
            )

    @admin.action(description="Activate selected Fleets (take new work)")
    def activate(self, request, queryset):
        self._set_state(request, queryset, FleetState.ACTIVE)

    @admin.action(description="Drain selected Fleets (no new work; running work continues)")
    def drain(self, request, queryset):
        self._set_state(request, queryset, FleetState.DRAINING)

    @admin.action(description="Disable selected Fleets (no new work; running work continues)")
    def disable(self, request, queryset):
        self._set_state(request, queryset, FleetState.DISABLED)


def register_fleet_action(action) -> None:
    """A higher app's action on Fleets (nodes: drain a Fleet's machines), registered as it
    registers a page section, so that this app never imports it."""
    if action not in FleetAdmin.actions:
        FleetAdmin.actions = [*FleetAdmin.actions, action]


def register_fleet_inline(inline) -> None:
    """A higher app's inline on the Fleet page (placement: its quotas), registered as a page
    section is; its formset's ``save_through_services(request, fleet)`` saves it."""
    if inline not in FleetAdmin.inlines:
        FleetAdmin.inlines = [*FleetAdmin.inlines, inline]
