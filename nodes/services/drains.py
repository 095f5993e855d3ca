"""Drains: a machine, or a Fleet's machines in one step, leaving (D1), drains past their
deadline, and a drain undone (resume).

Nothing here stops anything: a drain decides where new work may go — a draining node is
drained once its last command has finished and been cleaned up — and its deadline is when an
operator expected the machine idle, shown and audited once it passes. A machine that stays
after all is resumed: it takes work again, as Slurm's RESUME does.
"""

import logging

from django.db import transaction
from django.utils import timezone

from audit.services import Actor, audit_record, audit_record_many
from fleets.choices import FleetKind
from tuneplane.errors import Conflict, ValidationFailed

from ..choices import NODE_LIFECYCLE, SchedulingState
from ..models import Node
from ..selectors import commands_active_on, work_left_on
from .cordons import node_locked, node_not_removed, operator_reason

logger = logging.getLogger("tuneplane.nodes")


def node_state_set(
    node: Node,
    state: str,
    actor: Actor,
    *,
    forced: bool = False,
    action: str = "",
    before: dict | None = None,
    **after,
) -> None:
    """A locked node's scheduling state, by a move its lifecycle allows (NODE_LIFECYCLE), with
    what the change writes besides it, audited (``node.<state>`` unless ``action`` says)."""
    was = node.scheduling_state
    NODE_LIFECYCLE.check(was, state, target=node.pk)
    node.scheduling_state = state
    node.save(update_fields=["scheduling_state", "removed_at", "lease_expires_at", *KEPT_FIELDS])
    audit_record(
        actor=actor,
        action=action or f"node.{state}",
        target=node,
        before={"scheduling_state": was, **(before or {})},
        after={"scheduling_state": state, **after},
        forced=forced,
    )


# What a state change writes besides the state (a drain's who and why; a removal's session end).
KEPT_FIELDS = (
    "drain_reason",
    "drain_by",
    "drain_started_at",
    "drain_deadline",
    "drain_overdue_at",
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


def _drain_shown(node: Node) -> dict | None:
    """A node's drain as its audit events show it: who, why, since and until when."""
    if node.drain_started_at is None:
        return None
    return {
        "reason": node.drain_reason,
        "by": node.drain_by,
        "at": node.drain_started_at.isoformat(),
        "deadline": node.drain_deadline.isoformat() if node.drain_deadline else None,
    }


def node_resume(*, actor: Actor, node: Node) -> Node:
    """A draining or drained machine stays after all: its drain is undone and it takes new
    work again (Slurm's RESUME), audited as ``node.resumed`` with the drain it undid. What a
    draining node runs runs on; its cordons are records of their own and stay (L6). A
    gone node's drain is undone too: answering again, it is schedulable. A node without a
    drain is left as it is."""
    with transaction.atomic():
        node = node_locked(node.pk)
        node_not_removed(node, "resumed")
        drain = _drain_shown(node)
        leaving = node.scheduling_state in (SchedulingState.DRAINING, SchedulingState.DRAINED)
        if drain is None and not leaving:
            return node
        node.drain_reason = node.drain_by = ""
        node.drain_started_at = node.drain_deadline = node.drain_overdue_at = None
        node_state_set(
            node,
            SchedulingState.SCHEDULABLE if leaving else node.scheduling_state,
            actor,
            action="node.resumed",
            before={"drain": drain},
            drain=None,
        )
    logger.info("node %s resumed: it takes new work again", node.id)
    return node


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
