from datetime import timedelta

from django.conf import settings
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from fleets.selectors import fleets_visible_to
from tuneplane.permissions import is_admin

from .choices import ACTIVE_COMMAND_STATES, LEAVING, CommandKind, CommandState, SchedulingState
from .models import (
    CardAlias,
    ClusterSnapshot,
    ControlSession,
    JoinToken,
    Node,
    NodeCommand,
    NodeCordon,
)


def with_container_runtime(nodes: QuerySet) -> QuerySet:
    """The nodes whose inventory names a container runtime (nodes.inventory's
    has_container_runtime, in SQL): where a workload naming an image may run. A JSON null is
    excluded in so many words: SQLite's text of it is "null", which the pattern matches."""
    return nodes.filter(inventory__container_runtime__regex=r"\S").exclude(
        inventory__container_runtime=None
    )


def card_series(names) -> dict[str, str | None]:
    """Each card name's hardware series slug, or None while no admin has mapped it (J4).

    Read at query time, so a mapping takes effect without a re-join.
    """
    names = set(names)
    mapped = dict(
        CardAlias.objects.filter(name__in=names, series__isnull=False).values_list(
            "name", "series__slug"
        )
    )
    return {name: mapped.get(name) for name in names}


def cards_summary(
    inventory: dict, series: dict[str, str | None] | None = None, unhealthy=()
) -> dict:
    """A node's placeable cards per mapped series and in all, as Node keeps them for
    admission: its inventory's, less the devices its telemetry judged unhealthy.

    ``series`` is card_series() of the inventory's names, when the caller has it already;
    ``unhealthy`` the UUIDs of the node's unhealthy cards (Node.unhealthy_cards).
    """
    cards = inventory.get("cards", [])
    if series is None:
        series = card_series(card["name"] for card in cards)
    out: dict[str, int] = {}
    for device in inventory.get("devices") or []:
        if device["uuid"] in unhealthy:
            out[device["name"]] = out.get(device["name"], 0) + 1
    per_series: dict[str, int] = {}
    total = 0
    for card in cards:
        count = max(card["count"] - out.get(card["name"], 0), 0)
        total += count
        if series.get(card["name"]):
            per_series[series[card["name"]]] = per_series.get(series[card["name"]], 0) + count
    return {"series_cards": per_series, "card_count": total}


def unknown_cards(inventory: dict) -> list[str]:
    series = card_series(card["name"] for card in inventory.get("cards", []))
    return sorted(name for name, slug in series.items() if slug is None)


def nodes_visible_to(user) -> QuerySet[Node]:
    """Nodes of the Fleets the caller sees; administrators also see the removed nodes kept
    after their Fleet was deleted (F7)."""
    nodes = Node.objects.select_related("fleet")
    if is_admin(user):
        return nodes
    return nodes.filter(fleet__in=fleets_visible_to(user))


def nodes_answering_at(address: str, *, now=None, exclude_id: str = "") -> QuerySet[Node]:
    """Other live records at one address: live = seen within the placement freshness window."""
    now = now or timezone.now()
    since = now - timedelta(seconds=settings.TUNEPLANE_PLACEMENT_FRESHNESS)
    return (
        Node.objects.filter(address=address, last_seen_at__gte=since)
        .exclude(scheduling_state=SchedulingState.REMOVED)
        .exclude(pk=exclude_id)
    )


def nodes_with_fingerprint(fingerprint: str, *, exclude_id: str = "") -> QuerySet[Node]:
    if not fingerprint:
        return Node.objects.none()
    return (
        Node.objects.filter(fingerprint=fingerprint)
        .exclude(scheduling_state=SchedulingState.REMOVED)
        .exclude(pk=exclude_id)
    )


def addresses_shared(nodes) -> set[str]:
    """Which of these nodes' addresses another live record answers at too (J5)."""
    addresses = {node.address for node in nodes if node.address}
    since = timezone.now() - timedelta(seconds=settings.TUNEPLANE_PLACEMENT_FRESHNESS)
    rows = (
        Node.objects.filter(address__in=addresses, last_seen_at__gte=since)
        .exclude(scheduling_state=SchedulingState.REMOVED)
        .values_list("address", "id")
    )
    seen: dict[str, int] = {}
    for address, _ in rows:
        seen[address] = seen.get(address, 0) + 1
    return {address for address, count in seen.items() if count > 1}


def join_tokens_of(fleet) -> QuerySet[JoinToken]:
    return JoinToken.objects.filter(fleet=fleet).select_related("created_by", "node")


def fleet_nodes_blocking_deletion(fleet) -> list[str]:
    """F7's node half: a Fleet with nodes is not deletable."""
    ids = list(
        Node.objects.filter(fleet=fleet)
        .exclude(scheduling_state=SchedulingState.REMOVED)
        .values_list("id", flat=True)[:6]
    )
    if not ids:
        return []
    total = (
        Node.objects.filter(fleet=fleet).exclude(scheduling_state=SchedulingState.REMOVED).count()
    )
    shown = ", ".join(ids[:5]) + (", …" if total > 5 else "")
    return [f"{total} node{'s' if total != 1 else ''} ({shown}); remove them first"]


def live_sessions_of(nodes) -> dict:
    """Each node's open session whose lease has not expired (L1's "live lease"), by node id."""
    sessions = ControlSession.objects.filter(
        node__in=[node.pk for node in nodes],
        closed_at__isnull=True,
        lease_expires_at__gt=timezone.now(),
    )
    return {session.node_id: session for session in sessions}


def commands_pending(
    *, node_id: str | None = None, node_ids: list[str] | None = None, gateway: str | None = None
) -> list[NodeCommand]:
    """Pending commands, oldest first, in one statement: of one node, of several, or of the
    nodes whose open session is on one gateway replica."""
    pending = NodeCommand.objects.filter(state=CommandState.PENDING).order_by("created_at")
    if node_id is not None:
        pending = pending.filter(node_id=node_id)
    if node_ids is not None:
        pending = pending.filter(node_id__in=node_ids)
    if gateway is not None:
        pending = pending.filter(
            node__sessions__gateway=gateway, node__sessions__closed_at__isnull=True
        )
    return list(pending)


def commands_active_on(node) -> list[str]:
    """Ids of the node's work that may still be running — its run commands, and its members
    not yet cleaned up (R7) — what drain waits for and what a forced removal leaves behind
    (D3). A member's stop and cleanup are not work of their own."""
    return list(
        NodeCommand.objects.filter(node=node)
        .filter(
            Q(state__in=ACTIVE_COMMAND_STATES, kind=CommandKind.RUN)
            | Q(kind=CommandKind.START, cleaned_at__isnull=True)
        )
        .order_by("created_at")
        .values_list("id", flat=True)
    )


def work_left_on(node_ids) -> dict[str, dict[str, list[str]]]:
    """What drains still wait for, in one query: each node's commands that may still be
    running (the ids commands_active_on gives one node), by command kind."""
    left: dict[str, dict[str, list[str]]] = {}
    rows = (
        NodeCommand.objects.filter(node_id__in=list(node_ids), state__in=ACTIVE_COMMAND_STATES)
        .order_by("created_at")
        .values_list("node_id", "kind", "id")
    )
    for node_id, kind, command_id in rows:
        left.setdefault(node_id, {}).setdefault(kind, []).append(command_id)
    return left


def nodes_placeable(fleet_ids, now=None) -> QuerySet[Node]:
    """Nodes that may take new work now (L1, D1): a live control-session lease, inventory
    observed within TUNEPLANE_PLACEMENT_FRESHNESS, schedulable and not cordoned. A shown
    state alone is not enough. Whether the Fleet is active is the caller's gate."""
    return Node.objects.filter(placeable_now(now), fleet_id__in=list(fleet_ids))


def placeable_now(now=None) -> Q:
    """nodes_placeable's condition on a node row, for a query that also counts the others."""
    now = now or timezone.now()
    fresh = now - timedelta(seconds=settings.TUNEPLANE_PLACEMENT_FRESHNESS)
    return Q(
        ~Exists(NodeCordon.objects.filter(node_id=OuterRef("pk"))),
        scheduling_state=SchedulingState.SCHEDULABLE,
        lease_expires_at__gt=now,
        inventory_observed_at__gte=fresh,
    )


def nodes_coming_back(fleet_ids) -> QuerySet[Node]:
    """The nodes admission's fit counts (P8): every node of these Fleets that is not leaving.
    A cordoned, quiet or gone machine is coming back, and work that only it fits queues for
    it; a draining, drained or removed one is leaving (D1), as is a gone one whose drain was
    never undone. Placing work is the allocator's, on nodes_placeable only (L1)."""
    return Node.objects.filter(fleet_id__in=list(fleet_ids), drain_started_at__isnull=True).exclude(
        scheduling_state__in=LEAVING
    )


def cluster_machines_placeable(fleet_ids, now=None) -> dict[str, list[dict]]:
    """Cluster Fleets' machines that may take new work now (L1, D1): from a snapshot read
    within TUNEPLANE_PLACEMENT_FRESHNESS, schedulable in their manager's eyes. One query."""
    now = now or timezone.now()
    fresh = now - timedelta(seconds=settings.TUNEPLANE_PLACEMENT_FRESHNESS)
    snapshots = ClusterSnapshot.objects.filter(fleet_id__in=list(fleet_ids), observed_at__gte=fresh)
    return {
        fleet_id: [m for m in machines if m["state"] == SchedulingState.SCHEDULABLE]
        for fleet_id, machines in snapshots.values_list("fleet_id", "machines")
    }
