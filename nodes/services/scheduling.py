"""Whether a node takes new work: cordons, drain, removal. Each write audited, in one transaction.

None of these stops or kills anything that runs (D1): they decide where new work
may go. A storage cordon is the system's observation and an operator cordon an
operator's decision; each is lifted only by its own source (L6).
"""

import logging

from django.db import transaction
from django.utils import timezone

from audit.services import Actor, audit_record, audit_record_many
from fleets.choices import FleetDelivery
from tuneplane.errors import Conflict, ValidationFailed

from .. import bus
from ..choices import CommandKind, CommandState, CordonSource, SchedulingState
from ..models import ControlSession, Node, NodeCommand, NodeCordon, NodeCredential
from ..selectors import commands_active_on
from .observers import command_changed

logger = logging.getLogger("tuneplane.nodes")

STORAGE_LOST = "storage root not visible"
MAX_REASON = 200


def _locked(node_id: str) -> Node:
    return Node.objects.select_for_update().get(pk=node_id)


def _cordon_view(cordon: NodeCordon) -> dict:
    return {"source": cordon.source, "reason": cordon.reason, "by": cordon.created_by}


def _add_cordon(node: Node, source: str, reason: str, actor: Actor) -> NodeCordon:
    cordon = NodeCordon.objects.create(
        node=node, source=source, reason=reason, created_at=timezone.now(), created_by=actor.label
    )
    audit_record(
        actor=actor,
        action="node.cordoned",
        target=node,
        before={"cordon": None},
        after={"cordon": _cordon_view(cordon)},
    )
    return cordon


def _lift_cordon(node: Node, cordon: NodeCordon, actor: Actor) -> None:
    cordon.delete()
    audit_record(
        actor=actor,
        action="node.uncordoned",
        target=node,
        before={"cordon": _cordon_view(cordon)},
        after={"cordon": None},
    )


def node_observe_storage_root(*, node_id: str, visible: bool) -> bool:
    """L6: a shared-mount node that cannot see its storage root is cordoned by the system,
    and un-cordoned when it sees it again. Only the storage cordon moves. Returns whether
    anything changed."""
    with transaction.atomic():
        node = _locked(node_id)
        if (
            node.scheduling_state == SchedulingState.REMOVED
            or node.fleet.delivery != FleetDelivery.SHARED_MOUNT
        ):  # no Fleet once removed
            return False
        if node.inventory.get("storage_root_visible") != visible:
            # The observation is kept with the inventory, where the cordon sweep reads it.
            node.inventory = {**node.inventory, "storage_root_visible": visible}
            # No longer the report its digest names: the node sends its own next time.
            node.inventory_digest = ""
            node.save(update_fields=["inventory", "inventory_digest"])
        cordon = NodeCordon.objects.filter(node=node, source=CordonSource.STORAGE).first()
        actor = Actor.system("storage")
        if not visible and cordon is None:
            _add_cordon(node, CordonSource.STORAGE, STORAGE_LOST, actor)
            logger.warning("node %s cannot see its storage root: cordoned", node_id)
            return True
        if visible and cordon is not None:
            _lift_cordon(node, cordon, actor)
            logger.info("node %s sees its storage root again: storage cordon lifted", node_id)
            return True
    return False


UNKILLABLE = "a member's processes survived SIGKILL for a minute; its cards stay held"


def node_observe_unkillable(*, node_id: str) -> bool:
    """A member reported unkillable: the system cordons its node, and lifts that cordon once
    no member of the node is unkillable and uncleaned any more (the processes went, or the
    machine was rebooted). Call inside the transaction that stored the report."""
    node = _locked(node_id)
    stuck = NodeCommand.objects.filter(
        node=node, kind=CommandKind.START, reason="unkillable", cleaned_at__isnull=True
    ).exists()
    cordon = NodeCordon.objects.filter(node=node, source=CordonSource.UNKILLABLE).first()
    actor = Actor.system("unkillable")
    if stuck and cordon is None and node.scheduling_state != SchedulingState.REMOVED:
        _add_cordon(node, CordonSource.UNKILLABLE, UNKILLABLE, actor)
        logger.warning("node %s has unkillable processes: cordoned", node_id)
        return True
    if not stuck and cordon is not None:
        _lift_cordon(node, cordon, actor)
        logger.info("node %s: no unkillable member left; its cordon lifted", node_id)
        return True
    return False


def _not_removed(node: Node, verb: str) -> None:
    if node.scheduling_state == SchedulingState.REMOVED:
        raise Conflict(
            f"Node '{node.id}' is removed; it cannot be {verb}.", code="node_removed", rule="D4"
        )


def _reason(reason, doing: str) -> str:
    """An operator's cordon or drain says why (shown on the Fleet page and in the API)."""
    reason = reason.strip() if isinstance(reason, str) else ""
    if not reason or len(reason) > MAX_REASON:
        raise ValidationFailed(
            f"reason is required (at most {MAX_REASON} characters): say why "
            f"the machine is {doing}.",
            field="reason",
        )
    return reason


def node_cordon(*, actor: Actor, node: Node, reason: str) -> Node:
    """An operator's cordon: new work stops, nothing running stops (D1). A reason is required."""
    reason = _reason(reason, "cordoned")
    with transaction.atomic():
        node = _locked(node.pk)
        _not_removed(node, "cordoned")
        existing = NodeCordon.objects.filter(node=node, source=CordonSource.OPERATOR).first()
        if existing is None:
            _add_cordon(node, CordonSource.OPERATOR, reason, actor)
        elif existing.reason != reason:  # the same cordon, a new reason: one change
            before = _cordon_view(existing)
            existing.reason, existing.created_by = reason, actor.label
            existing.created_at = timezone.now()
            existing.save(update_fields=["reason", "created_by", "created_at"])
            audit_record(
                actor=actor,
                action="node.cordoned",
                target=node,
                before={"cordon": before},
                after={"cordon": _cordon_view(existing)},
            )
    return node


def node_uncordon(*, actor: Actor, node: Node) -> Node:
    """Lifts the operator's cordon only; a storage cordon stays until the mount returns (L6)."""
    with transaction.atomic():
        node = _locked(node.pk)
        _not_removed(node, "uncordoned")
        cordon = NodeCordon.objects.filter(node=node, source=CordonSource.OPERATOR).first()
        if cordon is not None:
            _lift_cordon(node, cordon, actor)
    return node


def _set_state(node: Node, state: str, actor: Actor, *, forced: bool = False, **after) -> None:
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


def _deadline(deadline):
    if deadline is not None and deadline <= timezone.now():
        raise ValidationFailed(
            "deadline must be in the future: the time by which the machine should be idle "
            "(nothing is stopped at it, D1).",
            field="deadline",
        )
    return deadline


def _drain(node: Node, actor: Actor, reason: str, deadline) -> bool:
    """Drains a locked node; False if it was draining or drained already (kept as it was)."""
    _not_removed(node, "drained")
    if node.scheduling_state in (SchedulingState.DRAINING, SchedulingState.DRAINED):
        return False
    active = commands_active_on(node)
    node.drain_reason, node.drain_by = reason, actor.label
    node.drain_started_at, node.drain_deadline = timezone.now(), deadline
    _set_state(
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
    reason, deadline = _reason(reason, "drained"), _deadline(deadline)
    with transaction.atomic():
        node = _locked(node.pk)
        _drain(node, actor, reason, deadline)
    return node


def node_drain_settle(*, node_id: str) -> None:
    """A draining node whose last command has finished is drained. Call inside the
    transaction that finished it."""
    node = _locked(node_id)
    if node.scheduling_state == SchedulingState.DRAINING and not commands_active_on(node):
        _set_state(node, SchedulingState.DRAINED, Actor.system("drain"))


def _abandon_members(node: Node, actor: Actor, now) -> None:
    """D3: a node removed by force leaves its members behind: each still-uncleaned member
    (start command) is recorded lost, reason ``abandoned``, audited, its observers told."""
    for command in NodeCommand.objects.select_for_update().filter(
        node=node, kind=CommandKind.START, cleaned_at__isnull=True
    ):
        before = {"state": command.state, "exit_code": command.exit_code, "reason": command.reason}
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
        node = _locked(node.pk)
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
        _set_state(
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


def storage_cordon_sweep() -> dict[str, int]:
    """Repairs what the gateway missed: the storage cordon follows the last storage-root
    observation of every shared-mount node (L6). An operator's cordon is never touched.

    Set-based, and safe beside the gateway and another sweep: it locks the node rows it
    may change first — as ``node_observe_storage_root`` does — and only then reads which
    cordons exist, so each change is made, and audited, once.
    """
    actor = Actor.system("storage")
    shared = (
        Node.objects.filter(fleet__delivery=FleetDelivery.SHARED_MOUNT)
        .exclude(scheduling_state=SchedulingState.REMOVED)
        .select_for_update(of=("self",))
        .order_by("pk")
    )
    storage = NodeCordon.objects.filter(source=CordonSource.STORAGE)
    cordon = {"source": CordonSource.STORAGE, "reason": STORAGE_LOST, "by": actor.label}
    with transaction.atomic():
        lost = list(
            shared.filter(inventory__storage_root_visible=False).values_list("id", flat=True)
        )
        missing = sorted(
            set(lost) - set(storage.filter(node_id__in=lost).values_list("node_id", flat=True))
        )
        NodeCordon.objects.bulk_create(
            [
                NodeCordon(
                    node_id=node_id,
                    source=CordonSource.STORAGE,
                    reason=STORAGE_LOST,
                    created_at=timezone.now(),
                    created_by=actor.label,
                )
                for node_id in missing
            ]
        )
        back = list(
            shared.filter(
                inventory__storage_root_visible=True, cordons__source=CordonSource.STORAGE
            ).values_list("id", flat=True)
        )
        lifted = sorted(storage.filter(node_id__in=back).values_list("node_id", flat=True))
        storage.filter(node_id__in=lifted).delete()
        audit_record_many(
            actor=actor,
            action="node.cordoned",
            target_type="nodes.node",
            changes=[(node_id, {"cordon": None}, {"cordon": cordon}) for node_id in missing],
        )
        audit_record_many(
            actor=actor,
            action="node.uncordoned",
            target_type="nodes.node",
            changes=[(node_id, {"cordon": cordon}, {"cordon": None}) for node_id in lifted],
        )
    return {"cordoned": len(missing), "uncordoned": len(lifted)}
