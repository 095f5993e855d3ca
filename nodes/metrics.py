"""The nodes' figures for Prometheus: joins and sweeps counted as they happen, and what the
fleet looks like now read from the database at each scrape of the web's /metrics (a few
aggregate queries, whatever the number of nodes)."""

from django.db.models import Count, Q
from django.utils import timezone
from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from .choices import LIVENESS_CAPABILITIES, SchedulingState
from .models import Node, NodeCordon

JOINS = Counter(
    "tuneplane_joins", "Join attempts by outcome and, refused, why.", ["outcome", "reason"]
)
SWEEP_DURATION = Histogram("tuneplane_liveness_sweep_seconds", "One liveness sweep.")
SWEEP_TRANSITIONS = Counter(
    "tuneplane_liveness_transitions", "Nodes a liveness sweep moved, by what changed.", ["change"]
)


class NodesCollector:
    def collect(self):
        nodes = Node.objects.exclude(scheduling_state=SchedulingState.REMOVED).filter(
            fleet__isnull=False
        )
        by_state = GaugeMetricFamily(
            "tuneplane_nodes", "Nodes by Fleet and scheduling state.", labels=["fleet", "state"]
        )
        for row in nodes.values("fleet_id", "scheduling_state").annotate(n=Count("id")):
            by_state.add_metric([row["fleet_id"], row["scheduling_state"]], row["n"])
        yield by_state
        now = timezone.now()
        quiet = {
            f"quiet_{c}": Count("id", filter=Q(**{f"quiet_{c}": True}))
            for c in LIVENESS_CAPABILITIES
        }
        connected = GaugeMetricFamily(
            "tuneplane_nodes_connected",
            "Nodes with a live control-session lease.",
            labels=["fleet"],
        )
        quiet_family = GaugeMetricFamily(
            "tuneplane_nodes_quiet",
            "Nodes quiet for a capability (L2–L4).",
            labels=["fleet", "capability"],
        )
        cards = GaugeMetricFamily(
            "tuneplane_gpu_cards_placeable",
            "Cards of the Fleet's nodes that may take new work (unhealthy ones left out).",
            labels=["fleet"],
        )
        for row in nodes.values("fleet_id").annotate(
            connected=Count("id", filter=Q(lease_expires_at__gt=now)),
            **quiet,
        ):
            connected.add_metric([row["fleet_id"]], row["connected"])
            for capability in LIVENESS_CAPABILITIES:
                quiet_family.add_metric([row["fleet_id"], capability], row[f"quiet_{capability}"])
        placeable = {}
        unhealthy = GaugeMetricFamily(
            "tuneplane_gpu_cards_unhealthy",
            "Cards judged unhealthy by their telemetry.",
            labels=["fleet"],
        )
        counted = {}
        for fleet_id, count, sick in nodes.values_list("fleet_id", "card_count", "unhealthy_cards"):
            placeable[fleet_id] = placeable.get(fleet_id, 0) + count
            counted[fleet_id] = counted.get(fleet_id, 0) + len(sick)
        for fleet_id, count in placeable.items():
            cards.add_metric([fleet_id], count)
            unhealthy.add_metric([fleet_id], counted[fleet_id])
        cordons = GaugeMetricFamily(
            "tuneplane_node_cordons", "Cordons by Fleet and source.", labels=["fleet", "source"]
        )
        for row in (
            NodeCordon.objects.filter(node__fleet__isnull=False)
            .values("node__fleet_id", "source")
            .annotate(n=Count("id"))
        ):
            cordons.add_metric([row["node__fleet_id"], row["source"]], row["n"])
        yield from (connected, quiet_family, cards, unhealthy, cordons)
