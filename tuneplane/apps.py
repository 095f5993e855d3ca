from django.apps import AppConfig
from django.db.models.signals import post_migrate


class TuneplaneConfig(AppConfig):
    name = "tuneplane"
    verbose_name = "Accounts and projects"

    def ready(self):
        from axes.signals import user_locked_out

        from .schedule import seed_schedule

        post_migrate.connect(seed_schedule, sender=self)
        user_locked_out.connect(_audit_lockout, dispatch_uid="tuneplane.login_locked_out")


def _audit_lockout(sender, request=None, username=None, ip_address=None, **kwargs):
    """django-axes says a login was refused as locked out, on every attempt while it lasts,
    whichever the address or username tried: one audit event while neither this username nor
    this address has had one within a cool-off, with how many refusals it stands for."""
    from django.conf import settings

    from .services import login_locked_out
    from .windows import first_in_window

    username, client = str(username or ""), str(ip_address or "")
    seconds = int(settings.AXES_COOLOFF_TIME.total_seconds())
    by_username = first_in_window("login-locked-out-username", username, seconds=seconds)
    by_address = first_in_window("login-locked-out-address", client, seconds=seconds)
    if by_username and by_address:
        login_locked_out(username=username, client=client, count=max(by_username, by_address))
