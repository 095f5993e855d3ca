from django.contrib import admin

from tuneplane.admin import ReadOnlyAdmin

from .models import (
    Dataset,
    Deployment,
    Environment,
    LifecycleJob,
    PlaygroundSession,
    Revision,
    TrainingJob,
    Volume,
)
from .selectors import deployments_with_status, revisions_with_ready


class WorkloadAdmin(ReadOnlyAdmin):
    """Workloads are submitted through the API, where admission answers; here they are read."""

    list_display = [
        "id",
        "name",
        "project",
        "fleet",
        "series",
        "cards",
        "nodes",
        "created_by",
        "created_at",
    ]
    list_filter = ["fleet", "project"]
    search_fields = ["name"]
    list_select_related = ["project", "fleet", "created_by"]


admin.site.register(TrainingJob, WorkloadAdmin)
admin.site.register(PlaygroundSession, WorkloadAdmin)
admin.site.register(Environment, WorkloadAdmin)


@admin.register(LifecycleJob)
class LifecycleJobAdmin(WorkloadAdmin):
    list_display = WorkloadAdmin.list_display[:2] + ["kind"] + WorkloadAdmin.list_display[2:]
    list_filter = ["kind", *WorkloadAdmin.list_filter]


class RevisionInline(admin.TabularInline):
    """Ready as the API reads it: one selector computes it (L2)."""

    model = Revision
    fields = ["number", "node", "ready", "created_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_view_permission(self, request, obj=None):
        # Administrators are staff users (tuneplane.admin.StaffAdmin): no model grants.
        return request.user.is_active and request.user.is_staff

    def has_add_permission(self, request, obj=None):
        return False

    has_change_permission = has_delete_permission = has_add_permission

    def get_queryset(self, request):
        return revisions_with_ready(super().get_queryset(request))

    @admin.display(boolean=True, description="Ready")
    def ready(self, revision) -> bool:
        return revision.ready


@admin.register(Deployment)
class DeploymentAdmin(WorkloadAdmin):
    """Status as the API reads it, for the whole list in its one query (L2)."""

    list_display = WorkloadAdmin.list_display[:4] + ["state", "status", "created_at"]
    list_filter = ["state", *WorkloadAdmin.list_filter]
    readonly_fields = ["status"]
    inlines = [RevisionInline]

    def get_queryset(self, request):
        return deployments_with_status(super().get_queryset(request))

    @admin.display(description="Status", ordering="status")
    def status(self, deployment) -> str:
        return deployment.status


@admin.register(Volume, Dataset)
class StorageAdmin(ReadOnlyAdmin):
    list_display = ["name", "project", "uri", "created_at"]
    list_filter = ["project"]
    search_fields = ["name"]
