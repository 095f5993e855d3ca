"""Drains: a machine, or a Fleet's machines in one step, leaving (D1), and drains past their
deadline.

Nothing here stops anything: a drain decides where new work may go — a draining node is
drained once its last command has finished and been cleaned up — and its deadline is when an
operator expected the machine idle, shown and audited once it passes.
"""

import logging

from django.db import transaction
from django.utils import timezone

from audit.services import Actor, audit_record, audit_record_many
from fleets.choices import FleetKind
from tuneplane.errors import Conflict, ValidationFailed

from ..choices import SchedulingState
from ..models import Node
from ..selectors import commands_active_on, work_left_on
from .cordons import node_locked, node_not_removed, operator_reason

logger = logging.getLogger("tuneplane.nodes")


def node_state_set(node: Node, state: str, actor: Actor, *, forced: bool = False, **after) -> None:
    """A locked node's scheduling state, with what the change writes besides it, audited."""
    before = node.scheduling_state
    node.scheduling_state = state
    node.save(update_fields=["scheduling_state", "removed_at", "lease_expires_at", *KEPT_FIELDS])
    audit_record(
        actor=actor,
        action=f"node.{state}",
        target=node,
        before={"scheduling_state": before},
        after={"scheduling_state": state, **after},
        forced=forced,
    )


# What a state change writes besides the state (a drain's who and why; a removal's session end).
KEPT_FIELDS = (
    "drain_reason",
    "drain_by",
    "drain_started_at",
    "drain_deadline",
    "last_session_closed_at",
    "last_session_close_reason",
)


def drain_deadline(deadline):
    """A drain's deadline, checked: in the future, or none."""
    if deadline is not None and deadline <= timezone.now():
        raise ValidationFailed(
            "deadline must be in the future: the time by which the machine should be idle "
            "(nothing is stopped at it, D1).",
            field="deadline",
        )
    return deadline


def node_drain_locked(node: Node, actor: Actor, reason: str, deadline) -> bool:
    """Drains a locked node; False if it was draining or drained already (kept as it was)."""
    node_not_removed(node, "drained")
    if node.scheduling_state in (SchedulingState.DRAINING, SchedulingState.DRAINED):
        return False
    active = commands_active_on(node)
    node.drain_reason, node.drain_by = reason, actor.label
    node.drain_started_at, node.drain_deadline = timezone.now(), deadline
    node_state_set(
        node,
        SchedulingState.DRAINING if active else SchedulingState.DRAINED,
        actor,
        reason=reason,
        deadline=deadline.isoformat() if deadline else None,
        commands_running=active,
    )
    return True


def node_drain(*, actor: Actor, node: Node, reason: str, deadline=None) -> Node:
    """The machine is leaving: new work stops, running work finishes (D1); drained when idle.
    A reason is required; a ``deadline`` kills nothing: past it the drain shows overdue."""
    reason, deadline = operator_reason(reason, "drained"), drain_deadline(deadline)
    with transaction.atomic():
        node = node_locked(node.pk)
        node_drain_locked(node, actor, reason, deadline)
    return node


def node_drain_settle(*, node_id: str) -> None:
    """A draining node whose last command has finished is drained. Call inside the
    transaction that finished it."""
    node = node_locked(node_id)
    if node.scheduling_state == SchedulingState.DRAINING and not commands_active_on(node):
        node_state_set(node, SchedulingState.DRAINED, Actor.system("drain"))


def fleet_nodes_drain(*, actor: Actor, fleet, reason: str, deadline=None) -> list[Node]:
    """Every machine of a node Fleet drained in one step with one reason (D1): one event per
    node that starts draining; those draining or drained already are left as they were."""
    reason, deadline = operator_reason(reason, "drained"), drain_deadline(deadline)
    if fleet.kind != FleetKind.NODE:
        raise Conflict(
            f"Fleet '{fleet.id}' is a {fleet.kind} Fleet: its manager drains its machines; "
            "set the Fleet's state to draining to stop new work here (rule D1).",
            rule="D1",
            code="not_a_node_fleet",
        )
    with transaction.atomic():
        nodes = list(
            Node.objects.select_for_update(no_key=True)
            .filter(fleet=fleet)
            .exclude(scheduling_state=SchedulingState.REMOVED)
            .order_by("pk")
        )
        for node in nodes:
            node_drain_locked(node, actor, reason, deadline)
    return nodes


def drains_overdue_mark(now=None) -> int:
    """D1: a drain past its deadline kills nothing. The node shows overdue, and one
    ``node.drain_overdue`` event per node says what still runs. One guarded UPDATE: two
    sweeps at once mark each node once."""
    now = now or timezone.now()
    with transaction.atomic():
        overdue = (
            Node.objects.select_for_update(no_key=True)
            .filter(
                scheduling_state=SchedulingState.DRAINING,
                drain_deadline__lte=now,
                drain_overdue_at__isnull=True,
            )
            .order_by("pk")
        )
        rows = list(overdue.values_list("id", "drain_deadline"))
        if not rows:
            return 0
        left = work_left_on(node_id for node_id, _ in rows)
        Node.objects.filter(pk__in=[node_id for node_id, _ in rows]).update(drain_overdue_at=now)
        audit_record_many(
            actor=Actor.system("drain"),
            action="node.drain_overdue",
            target_type="nodes.node",
            changes=[
                (
                    node_id,
                    {"drain_overdue": False},
                    {
                        "drain_overdue": True,
                        "deadline": deadline.isoformat(),
                        "still_running": left.get(node_id, {}),
                    },
                )
                for node_id, deadline in rows
            ],
        )
    logger.warning("%d drain(s) past their deadline; nothing was stopped (D1)", len(rows))
    return len(rows)
