from django.apps import AppConfig


class NodesConfig(AppConfig):
    """Machines of node Fleets: join tokens, identities, control sessions (issues to come)."""

    name = "nodes"
    verbose_name = "Nodes"
