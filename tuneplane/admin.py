from django.contrib import admin, messages

from audit.services import Actor

from . import services
from .errors import ApplicationError
from .models import ApiToken, Membership, Project


class StaffAdmin(admin.ModelAdmin):
    """Administrators are staff users: no per-model permission grants to keep in step."""

    def _is_staff(self, request) -> bool:
        return request.user.is_active and request.user.is_staff

    def has_module_permission(self, request):
        return self._is_staff(request)

    def has_view_permission(self, request, obj=None):
        return self._is_staff(request)

    def has_add_permission(self, request):
        return self._is_staff(request)

    def has_change_permission(self, request, obj=None):
        return self._is_staff(request)

    def has_delete_permission(self, request, obj=None):
        return self._is_staff(request)

    def delete_each(self, request, queryset) -> None:
        """The bulk delete action, one object at a time through this admin's delete_model (so
        each goes through its service); one refused is said, the others still go."""
        for obj in queryset:
            try:
                self.delete_model(request, obj)
            except ApplicationError as error:
                self.message_user(request, f"{obj}: {error.message}", messages.ERROR)


class ReadOnlyAdmin(StaffAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class MembershipInline(admin.TabularInline):
    """Members are added and removed, each through a service that audits it (A1); a row is
    never edited into another user's."""

    model = Membership
    extra = 1

    def has_view_permission(self, request, obj=None):
        return request.user.is_staff

    has_add_permission = has_delete_permission = has_view_permission

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Project)
class ProjectAdmin(StaffAdmin):
    list_display = ["slug", "name", "max_priority", "created_at"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]

    def get_readonly_fields(self, request, obj=None):
        # Workloads and API calls name a project by its slug: fixed once created.
        return ["slug"] if obj is not None else []

    def save_model(self, request, obj, form, change):
        actor = Actor.of_user(request.user)
        if change:
            services.project_update(
                actor=actor,
                project=obj,
                name=form.cleaned_data["name"],
                max_priority=form.cleaned_data.get("max_priority"),
            )
        else:
            project = services.project_create(
                actor=actor,
                slug=form.cleaned_data["slug"],
                name=form.cleaned_data["name"],
                max_priority=form.cleaned_data.get("max_priority") or 0,
            )
            obj.pk, obj.created_at = project.pk, project.created_at  # for the inline rows

    def save_formset(self, request, form, formset, change):
        actor = Actor.of_user(request.user)
        formset.save(commit=False)
        for membership in formset.deleted_objects:
            services.membership_remove(actor=actor, membership=membership)
        for membership in formset.new_objects:
            services.membership_add(actor=actor, project=form.instance, user=membership.user)

    def delete_model(self, request, obj):
        services.project_delete(actor=Actor.of_user(request.user), project=obj)

    def delete_queryset(self, request, queryset):
        self.delete_each(request, queryset)


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    """Tokens are made with ``manage.py create_api_token`` (shown once) and revoked here."""

    list_display = ["prefix", "user", "name", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["prefix", "user__username", "name"]
    actions = ["revoke"]
    exclude = ["digest"]

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):
        for token in queryset:
            services.api_token_revoke(actor=Actor.of_user(request.user), token=token)
        self.message_user(request, f"Revoked {queryset.count()} token(s).", messages.SUCCESS)
