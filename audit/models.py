from django.db import models

from .choices import ActorType


class AppendOnly(Exception):
    pass


class AuditEventQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise AppendOnly("audit events are never edited")

    def delete(self):
        raise AppendOnly("audit events are never deleted")


class AuditEvent(models.Model):
    """One change to the world: who, what, to which target, when, before and after.

    Append-only. The actor is kept as text, not a foreign key, so that removing
    a user or a node never rewrites the history of what they did. A database
    trigger (migration 0002) refuses UPDATE and DELETE below the ORM as well.
    """

    at = models.DateTimeField(db_index=True)
    actor_type = models.CharField(max_length=16, choices=ActorType.choices)
    actor_id = models.CharField(max_length=150, blank=True)
    actor_label = models.CharField(max_length=200, blank=True)
    action = models.CharField(max_length=64, db_index=True)
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=150)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    forced = models.BooleanField(default=False)
    correlation_id = models.CharField(max_length=64, blank=True, db_index=True)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["target_type", "target_id", "-at"])]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_label or self.actor_type} {self.action}"

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise AppendOnly("audit events are never edited")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AppendOnly("audit events are never deleted")
