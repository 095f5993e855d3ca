from django.apps import AppConfig


class FleetsConfig(AppConfig):
    name = "fleets"
    verbose_name = "Fleets"

    def ready(self):
        from tuneplane.metrics import register_scrape_collector

        from .metrics import FleetsCollector

        register_scrape_collector(FleetsCollector())
