from django.apps import AppConfig


class TuneplaneConfig(AppConfig):
    name = "tuneplane"
    verbose_name = "Accounts and projects"
