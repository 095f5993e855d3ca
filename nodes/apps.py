from django.apps import AppConfig


class NodesConfig(AppConfig):
    """Machines of node Fleets: join tokens, identities, credentials, the card registry."""

    name = "nodes"
    verbose_name = "Nodes"

    def ready(self):
        from fleets.deletion import register_deletion_blocker, register_deletion_release
        from fleets.page import register_fleet_page_section
        from tuneplane.metrics import register_scrape_collector

        from .fleet_page import fleet_cluster_section, fleet_nodes_section
        from .health_shown import fleet_health_section
        from .metrics import NodesCollector
        from .selectors import fleet_nodes_blocking_deletion
        from .services.checks import check_command_changed
        from .services.observers import register_command_observer
        from .services.removal import removed_nodes_detach

        register_deletion_blocker(fleet_nodes_blocking_deletion)
        register_deletion_release(removed_nodes_detach)
        register_fleet_page_section(fleet_health_section)  # H7's banner first
        register_fleet_page_section(fleet_nodes_section)
        register_fleet_page_section(fleet_cluster_section)
        register_scrape_collector(NodesCollector())
        register_command_observer(check_command_changed)  # H5: a check's end, a member's
