from django.contrib import admin

from tuneplane.admin import ReadOnlyAdmin

from .models import (Dataset, Deployment, Environment, LifecycleJob, PlaygroundSession, Revision,
                     TrainingJob, Volume)


class WorkloadAdmin(ReadOnlyAdmin):
    """Workloads are submitted through the API, where admission answers; here they are read."""

    list_display = ["id", "name", "project", "fleet", "series", "cards", "nodes", "created_by",
                    "created_at"]
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
    model = Revision
    fields = ["number", "node", "ready", "created_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False


@admin.register(Deployment)
class DeploymentAdmin(WorkloadAdmin):
    list_display = WorkloadAdmin.list_display[:4] + ["state", "created_at"]
    list_filter = ["state", *WorkloadAdmin.list_filter]
    inlines = [RevisionInline]


@admin.register(Volume, Dataset)
class StorageAdmin(ReadOnlyAdmin):
    list_display = ["name", "project", "uri", "created_at"]
    list_filter = ["project"]
    search_fields = ["name"]
