from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import BasePermission

from tuneplane.permissions import is_admin


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
