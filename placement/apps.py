from django.apps import AppConfig


class PlacementConfig(AppConfig):
    """Workload records and admission: which Fleet takes a job, or why none can."""

    name = "placement"
    verbose_name = "Placement"

    def ready(self):
        from fleets.deletion import register_deletion_blocker
        from nodes.services.commands import register_command_observer

        from . import (
            tasks,  # noqa: F401 -- registered wherever placement runs: services send them by name
        )
        from .services import live_deployments_blocking_deletion, workload_records_blocking_deletion

        register_deletion_blocker(live_deployments_blocking_deletion)
        register_deletion_blocker(workload_records_blocking_deletion)
        from .services.runs import member_command_observed

        register_command_observer(member_command_observed)
