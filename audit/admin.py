from django.contrib import admin

from tuneplane.admin import ReadOnlyAdmin

from .models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    """The audit log: nobody adds, changes or deletes an event here (A1)."""

    list_display = [
        "at",
        "actor_type",
        "actor_label",
        "action",
        "target_type",
        "target_id",
        "forced_shown",
    ]
    list_filter = ["action", "target_type", "actor_type", "forced"]
    search_fields = ["target_id", "actor_label", "correlation_id"]
    date_hierarchy = "at"
    readonly_fields = [f.name for f in AuditEvent._meta.fields]

    @admin.display(description="forced", ordering="forced")
    def forced_shown(self, event: AuditEvent) -> str:
        """A forced change is said; the usual unforced one shows nothing, not a red cross on
        every row (issue 49)."""
        return "forced" if event.forced else ""
