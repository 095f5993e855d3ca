"""The nodes' figures for Prometheus: joins and sweeps counted as they happen, and what the
fleet looks like now read from the database at each scrape of the web's /metrics (a few
aggregate queries, whatever the number of nodes)."""

from django.db.models import Count, Q, Sum
from django.utils import timezone
from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from .choices import LIVENESS_CAPABILITIES, SchedulingState
from .models import HealthBreaker, Node, NodeCordon
from .selectors import nodes_placeable

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
        for row in nodes.values("fleet_id").annotate(
            connected=Count("id", filter=Q(lease_expires_at__gt=now)),
            **quiet,
        ):
            connected.add_metric([row["fleet_id"]], row["connected"])
            for capability in LIVENESS_CAPABILITIES:
                quiet_family.add_metric([row["fleet_id"], capability], row[f"quiet_{capability}"])
        cards = GaugeMetricFamily(
            "tuneplane_gpu_cards",
            "Cards of the Fleet's machines, by health (unhealthy: quarantined, H6).",
            labels=["fleet", "health"],
        )
        counted: dict[tuple[str, str], int] = {}
        for fleet_id, count, sick in nodes.values_list("fleet_id", "card_count", "unhealthy_cards"):
            for health, n in (("healthy", count), ("unhealthy", len(sick))):
                counted[(fleet_id, health)] = counted.get((fleet_id, health), 0) + n
        for labels, count in sorted(counted.items()):
            cards.add_metric(list(labels), count)
        placeable = GaugeMetricFamily(
            "tuneplane_gpu_cards_placeable",
            "Healthy cards of the machines that may take new work now (L1, no cordon).",
            labels=["fleet"],
        )
        fleets = dict.fromkeys(sorted({fleet_id for fleet_id, _ in counted}), 0)
        for row in nodes_placeable(fleets, now).values("fleet_id").annotate(n=Sum("card_count")):
            fleets[row["fleet_id"]] = row["n"] or 0
        for fleet_id, count in fleets.items():
            placeable.add_metric([fleet_id], count)
        cordons = GaugeMetricFamily(
            "tuneplane_node_cordons", "Cordons by Fleet and source.", labels=["fleet", "source"]
        )
        for row in (
            NodeCordon.objects.filter(node__fleet__isnull=False)
            .values("node__fleet_id", "source")
            .annotate(n=Count("id"))
        ):
            cordons.add_metric([row["node__fleet_id"], row["source"]], row["n"])
        breakers = GaugeMetricFamily(
            "tuneplane_health_breaker_tripped",
            "1 while a Fleet's health breaker is tripped: automatic card quarantine stopped (H7).",
            labels=["fleet"],
        )
        for fleet_id, tripped_at in HealthBreaker.objects.values_list("fleet_id", "tripped_at"):
            breakers.add_metric([fleet_id], 0 if tripped_at is None else 1)
        checked = GaugeMetricFamily(
            "tuneplane_gpu_card_checks",
            "Cards by the state of their last health check (H5): due, checking, passed, failed.",
            labels=["fleet", "state"],
        )
        states: dict[tuple[str, str], int] = {}
        for fleet_id, records in nodes.exclude(card_checks={}).values_list(
            "fleet_id", "card_checks"
        ):
            for record in records.values():
                key = (fleet_id, record.get("state") or "")
                states[key] = states.get(key, 0) + 1
        for labels, count in sorted(states.items()):
            checked.add_metric(list(labels), count)
        yield from (connected, quiet_family, cards, placeable, cordons, breakers, checked)
