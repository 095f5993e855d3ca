from django.apps import AppConfig


class PlacementConfig(AppConfig):
    """Workload records and admission: which Fleet takes a job, or why none can."""

    name = "placement"
    verbose_name = "Placement"
