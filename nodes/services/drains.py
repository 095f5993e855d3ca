"""A Fleet's machines drained in one step, and drains past their deadline (D1).

Nothing here stops anything: a drain decides where new work may go, and its deadline is
when an operator expected the machine idle, shown and audited once it passes.
"""

import logging

from django.db import transaction
from django.utils import timezone

from audit.services import Actor, audit_record_many
from fleets.choices import FleetKind
from tuneplane.errors import Conflict

from ..choices import SchedulingState
from ..models import Node
from ..selectors import work_left_on

# One drain of one locked node, and the checks of its reason and deadline: node_drain's own.
from .scheduling import _deadline, _drain, _reason

logger = logging.getLogger("tuneplane.nodes")


def fleet_nodes_drain(*, actor: Actor, fleet, reason: str, deadline=None) -> list[Node]:
    """Every machine of a node Fleet drained in one step with one reason (D1): one event per
    node that starts draining; those draining or drained already are left as they were."""
    reason, deadline = _reason(reason, "drained"), _deadline(deadline)
    if fleet.kind != FleetKind.NODE:
        raise Conflict(
            f"Fleet '{fleet.id}' is a {fleet.kind} Fleet: its manager drains its machines; "
            "set the Fleet's state to draining to stop new work here (rule D1).",
            rule="D1",
            code="not_a_node_fleet",
        )
    with transaction.atomic():
        nodes = list(
            Node.objects.select_for_update()
            .filter(fleet=fleet)
            .exclude(scheduling_state=SchedulingState.REMOVED)
            .order_by("pk")
        )
        for node in nodes:
            _drain(node, actor, reason, deadline)
    return nodes


def drains_overdue_mark(now=None) -> int:
    """D1: a drain past its deadline kills nothing. The node shows overdue, and one
    ``node.drain_overdue`` event per node says what still runs. One guarded UPDATE: two
    sweeps at once mark each node once."""
    now = now or timezone.now()
    with transaction.atomic():
        overdue = (
            Node.objects.select_for_update()
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
