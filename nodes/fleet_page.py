"""The machines section of a Fleet's page (L7): connection, scheduling and inventory as
three separate groups, so an operator reads every Fleet the same way.

A node Fleet: six queries whatever the number of nodes (the nodes with their cordons, their
live sessions, the card registry, the work its drains wait for, their telemetry), plus
liveness per capability.
A cluster Fleet: its snapshot, where connection is the manager's API answering and the last
successful read.
"""

from django.utils import timezone

from fleets.choices import FleetKind

from .choices import LIVENESS_CAPABILITIES, SchedulingState
from .models import ClusterSnapshot
from .selectors import card_series, live_sessions_of, work_left_on
from .telemetry_shown import telemetry_of, telemetry_shown


def _age(since, now) -> str:
    if since is None:
        return "never"
    seconds = int((now - since).total_seconds())
    if seconds < 120:
        return f"{seconds}s ago"
    if seconds < 7200:
        return f"{seconds // 60}m ago"
    return f"{seconds // 3600}h ago"


def node_rows(fleet, now=None) -> list[dict]:
    now = now or timezone.now()
    nodes = list(
        fleet.nodes.exclude(scheduling_state=SchedulingState.REMOVED)
        .prefetch_related("cordons")
        .order_by("hostname", "id")
    )
    sessions = live_sessions_of(nodes)
    series = card_series(name for node in nodes for name in node.card_names())
    left = work_left_on(node.pk for node in nodes if node.drain_started_at)
    telemetry = telemetry_of(node.pk for node in nodes)
    rows = []
    for node in nodes:
        session = sessions.get(node.id)
        cordons = list(node.cordons.all())
        inventory = node.inventory
        rows.append(
            {
                "node": node,
                "connection": {
                    "connected": session is not None,
                    "since": session.opened_at if session else None,
                    "heartbeat_age": _age(
                        session.last_heartbeat_at if session else node.last_seen_at, now
                    ),
                    "gateway": session.gateway if session else "",
                    "last_heard_at": node.last_seen_at,
                    "closed_at": None if session else node.last_session_closed_at,
                    "close_reason": "" if session else node.last_session_close_reason,
                },
                "scheduling": {
                    "state": node.scheduling_shown(cordons),
                    "cordons": cordons,
                    "drain": _drain(node, left.get(node.id, {})),
                },
                "inventory": {
                    "cards": [
                        {**card, "series": series.get(card["name"])}
                        for card in inventory.get("cards", [])
                    ],
                    "driver": inventory.get("driver") or "—",
                    "container_runtime": inventory.get("container_runtime") or "—",
                    "storage_root_visible": inventory.get("storage_root_visible"),
                    "observed_age": _age(node.inventory_observed_at, now),
                },
                "liveness": list(node.liveness().items()),
                "telemetry": _telemetry(node, telemetry.get(node.id), now),
            }
        )
    return rows


def _telemetry(node, row, now) -> dict | None:
    """Each card as a compact bar (utilisation, memory), its health and why; the sample's age."""
    shown = telemetry_shown(node, row, now)
    if shown is None:
        return None
    for card in shown["cards"]:
        card["utilization_width"] = max(0, min(100, round(card["utilization_percent"])))
        card["memory_width"] = round(100 * (card["memory_used_ratio"] or 0))
    return {**shown, "age": _age(shown["observed_at"], now)}


def _drain(node, left: dict[str, list[str]]) -> dict | None:
    if node.drain_started_at is None:
        return None
    return {
        "reason": node.drain_reason,
        "by": node.drain_by,
        "at": node.drain_started_at,
        "deadline": node.drain_deadline,
        "overdue": node.drain_overdue_at is not None,
        "work_left": sorted((kind, len(ids)) for kind, ids in left.items()),
    }


def drain_progress(rows) -> dict | None:
    """How far the Fleet's drains have come: nodes drained of those draining, and the work
    left on them by kind (D1: it finishes; nothing is stopped)."""
    drains = [row["scheduling"]["drain"] for row in rows if row["scheduling"]["drain"]]
    if not drains:
        return None
    left: dict[str, int] = {}
    for drain in drains:
        for kind, count in drain["work_left"]:
            left[kind] = left.get(kind, 0) + count
    drained = sum(1 for row in rows if row["node"].scheduling_state == SchedulingState.DRAINED)
    return {
        "drained": drained,
        "draining": len(drains),
        "overdue": sum(1 for drain in drains if drain["overdue"]),
        "work_left": sorted(left.items()),
    }


def fleet_nodes_section(fleet) -> dict | None:
    if fleet.kind != FleetKind.NODE:
        return None
    rows = node_rows(fleet)
    return {
        "template": "admin/nodes/fleet_nodes.html",
        "rows": rows,
        "drain": drain_progress(rows),
        "capabilities": [c for c in fleet.capabilities if c in LIVENESS_CAPABILITIES],
    }


def fleet_cluster_section(fleet) -> dict | None:
    if fleet.kind == FleetKind.NODE:
        return None
    now = timezone.now()
    snapshot = ClusterSnapshot.objects.filter(fleet=fleet).first() or ClusterSnapshot(fleet=fleet)
    series = card_series(card["name"] for machine in snapshot.machines for card in machine["cards"])
    machines = [
        {
            **machine,
            "cards": [{**card, "series": series.get(card["name"])} for card in machine["cards"]],
        }
        for machine in snapshot.machines
    ]
    return {
        "template": "admin/nodes/fleet_cluster.html",
        "kind": fleet.kind,
        "snapshot": snapshot,
        "machines": machines,
        "observed_age": _age(snapshot.observed_at, now),
        "attempted_age": _age(snapshot.attempted_at, now),
        "error_age": _age(snapshot.error_since, now),
    }
