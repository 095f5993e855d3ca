from django.apps import AppConfig


class PlacementConfig(AppConfig):
    """Workload records, admission (which Fleet takes a job, or why none can), and on node
    Fleets the allocator and the attempts that run (DESIGN §7)."""

    name = "placement"
    verbose_name = "Placement"

    def ready(self):
        from fleets.deletion import register_deletion_blocker, register_deletion_release
        from fleets.page import register_fleet_page_section
        from nodes.node_page import register_node_page_section
        from nodes.services.observers import register_command_observer
        from tuneplane.metrics import register_scrape_collector

        from . import (
            tasks,  # noqa: F401 -- registered wherever placement runs: services send them by name
        )
        from .deletion import live_deployments_blocking_deletion, workload_records_blocking_deletion
        from .fleet_page import fleet_quota_section, fleet_work_section
        from .metrics import QueueCollector, WaitingCollector
        from .node_page import node_members_section
        from .quota_metrics import QuotaCollector
        from .services.reports import command_observed
        from .services.serving import stopped_deployments_release

        register_deletion_blocker(live_deployments_blocking_deletion)
        register_deletion_blocker(workload_records_blocking_deletion)
        register_deletion_release(stopped_deployments_release)
        # nodes carries the agents' reports; placement follows its members in them.
        register_command_observer(command_observed)
        register_fleet_page_section(fleet_work_section)
        register_fleet_page_section(fleet_quota_section)
        register_node_page_section(node_members_section)
        register_scrape_collector(QueueCollector())
        register_scrape_collector(WaitingCollector())
        register_scrape_collector(QuotaCollector())
