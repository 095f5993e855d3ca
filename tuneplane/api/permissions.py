from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import BasePermission


def is_admin(user) -> bool:
    """Administrators are staff users."""
    return bool(user and user.is_authenticated and user.is_active and user.is_staff)


def require_admin(request, what: str = "do this") -> None:
    """Raise 403 unless the caller is an administrator.

    Views call it after looking the target up through its visibility selector,
    so that an invisible target is a 404 before it can be a 403 (F8).
    """
    if not is_admin(request.user):
        raise PermissionDenied(f"Only administrators may {what}.")


class IsAdmin(BasePermission):
    message = "Only administrators may do this."

    def has_permission(self, request, view):
        return is_admin(request.user)
