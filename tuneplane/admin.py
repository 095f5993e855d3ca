from django.contrib import admin, messages

from audit.services import Actor

from . import services
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


class ReadOnlyAdmin(StaffAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1

    def has_view_permission(self, request, obj=None):
        return request.user.is_staff

    has_add_permission = has_change_permission = has_delete_permission = has_view_permission


@admin.register(Project)
class ProjectAdmin(StaffAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]


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
