from django.apps import AppConfig
from django.db.models.signals import post_migrate


class TuneplaneConfig(AppConfig):
    name = "tuneplane"
    verbose_name = "Accounts and projects"

    def ready(self):
        from .schedule import seed_schedule

        post_migrate.connect(seed_schedule, sender=self)
