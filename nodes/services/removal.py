"""Removal: a drained machine leaves the Fleet (D2), a gone one only by force (D3), and its
credential dies at the gateway (D4). A removed node's record outlives its Fleet, for the
audit log (F7). Every write audited, in one transaction.
"""

import logging

from django.db import transaction
from django.utils import timezone

from audit.services import Actor, audit_record, audit_record_many
from tuneplane.errors import Conflict

from .. import bus
from ..choices import (
    ACTIVE_COMMAND_STATES,
    COMMAND_LIFECYCLE,
    CommandKind,
    CommandState,
    SchedulingState,
)
from ..models import ControlSession, Node, NodeCommand, NodeCredential
from ..selectors import commands_active_on
from .cordons import node_locked
from .drains import node_state_set
from .observers import command_changed

logger = logging.getLogger("tuneplane.nodes")


def _abandon_members(node: Node, actor: Actor, now) -> None:
    """D3: a node removed by force leaves its members behind: each member (start command)
    that may still run there is recorded lost, reason ``abandoned``, audited, its observers
    told. One that had finished keeps its end: only its cleanup is left behind."""
    for command in NodeCommand.objects.select_for_update().filter(
        node=node,
        kind=CommandKind.START,
        cleaned_at__isnull=True,
        state__in=(*ACTIVE_COMMAND_STATES, CommandState.LOST),
    ):
        before = {"state": command.state, "exit_code": command.exit_code, "reason": command.reason}
        COMMAND_LIFECYCLE.check(command.state, CommandState.LOST, target=command.pk)
        command.state, command.reason, command.updated_at = CommandState.LOST, "abandoned", now
        command.save(update_fields=["state", "reason", "updated_at"])
        audit_record(
            actor=actor,
            action="node_command.abandoned",
            target=command,
            before=before,
            after={"state": command.state, "reason": command.reason},
            forced=True,
        )
        command_changed(command, before)


def node_remove(*, actor: Actor, node: Node, force: bool = False) -> Node:
    """D2: only a drained node is removed; D3: ``force`` removes a gone one, audited as forced
    with what it leaves behind; D4: its credential dies and its stream is closed."""
    with transaction.atomic():
        node = node_locked(node.pk)
        if node.scheduling_state == SchedulingState.REMOVED:
            return node
        left_behind = commands_active_on(node)
        if node.scheduling_state == SchedulingState.GONE and not force:
            raise Conflict(
                f"Node '{node.id}' is gone. Removing it leaves behind what nothing can reconcile "
                f"({len(left_behind)} command(s) recorded as running); pass force=true to remove "
                "it anyway (rule D3).",
                rule="D3",
                code="node_gone",
                left_behind=left_behind,
            )
        if node.scheduling_state not in (SchedulingState.DRAINED, SchedulingState.GONE):
            raise Conflict(
                f"Node '{node.id}' is {node.scheduling_state}: drain first, and remove it once "
                "it is drained (rule D2).",
                rule="D2",
                code="node_not_drained",
            )
        now = timezone.now()
        revoked = NodeCredential.objects.filter(node=node, revoked_at__isnull=True).update(
            revoked_at=now
        )
        if ControlSession.objects.filter(node=node, closed_at__isnull=True).update(
            closed_at=now, close_reason="node removed"
        ):
            node.last_session_closed_at, node.last_session_close_reason = now, "node removed"
        node.removed_at = now
        node.lease_expires_at = None
        node_state_set(
            node,
            SchedulingState.REMOVED,
            actor,
            forced=force,
            left_behind=left_behind,
            credentials_revoked=revoked,
        )
        if force:
            _abandon_members(node, actor, now)
        bus.publish_on_commit(bus.CLOSE, node.id, reason="node removed")
    logger.info("node %s removed%s", node.id, " (forced)" if force else "")
    return node


def removed_nodes_detach(*, actor: Actor, fleet) -> dict:
    """F7: a removed node's record outlives its Fleet, for the audit log: as the Fleet is
    deleted (a release of its deletion, in its transaction) each removed node is detached
    from it and keeps its id in ``former_fleet``, with its credentials, sessions, commands
    and audit trail. One ``node.detached`` event per node; returns their ids for the
    Fleet's deletion event."""
    with transaction.atomic():
        removed = Node.objects.filter(fleet=fleet, scheduling_state=SchedulingState.REMOVED)
        ids = list(removed.select_for_update().order_by("pk").values_list("id", flat=True))
        if not ids:
            return {}
        Node.objects.filter(pk__in=ids).update(fleet=None, former_fleet=fleet.pk)
        audit_record_many(
            actor=actor,
            action="node.detached",
            target_type="nodes.node",
            changes=[
                (node_id, {"fleet": fleet.pk}, {"fleet": None, "former_fleet": fleet.pk})
                for node_id in ids
            ],
        )
    logger.info("fleet %s: %d removed node(s) detached, kept for the audit log", fleet.pk, len(ids))
    return {"nodes_detached": ids}
