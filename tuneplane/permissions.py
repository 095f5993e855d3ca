"""Who may do what, for services and selectors as much as for the API."""


def is_admin(user) -> bool:
    """Administrators are staff users."""
    return bool(user and user.is_authenticated and user.is_active and user.is_staff)
