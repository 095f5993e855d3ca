"""Cordons: whether a node takes new work, by each source's own decision (D1, L6).

A cordon stops new work and kills nothing. An operator's cordon is an operator's decision; a
storage cordon (a shared-mount node that cannot see its storage root) and an unkillable one
(a member that survived SIGKILL) are the system's observations; a GPU health cordon is
nodes.services.health's. Each is lifted only by its own source (L6). Every write audited, in
one transaction, the node's row locked first (``node_locked``).
"""

import logging

from django.db import transaction
from django.utils import timezone

from audit.services import Actor, audit_record, audit_record_many
from fleets.choices import FleetDelivery
from tuneplane.errors import Conflict, ValidationFailed

from ..choices import CommandKind, CordonSource, SchedulingState
from ..models import Node, NodeCommand, NodeCordon

logger = logging.getLogger("tuneplane.nodes")

STORAGE_LOST = "storage root not visible"


MAX_REASON = 200


def node_locked(node_id: str) -> Node:
    """The node, its row locked: every writer of a node's scheduling takes it first. FOR NO
    KEY UPDATE, as every lock on a node row here (a node's key never changes): the key-share
    lock an insert of its commands takes on it never waits for a cordon or a drain."""
    return Node.objects.select_for_update(no_key=True).get(pk=node_id)


def _cordon_view(cordon: NodeCordon) -> dict:
    return {"source": cordon.source, "reason": cordon.reason, "by": cordon.created_by}


def cordon_add(node: Node, source: str, reason: str, actor: Actor) -> NodeCordon:
    """A cordon from ``source`` on a locked node, audited."""
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


def cordon_lift(node: Node, cordon: NodeCordon, actor: Actor) -> None:
    """A cordon lifted from a locked node, audited."""
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
        node = node_locked(node_id)
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
            cordon_add(node, CordonSource.STORAGE, STORAGE_LOST, actor)
            logger.warning("node %s cannot see its storage root: cordoned", node_id)
            return True
        if visible and cordon is not None:
            cordon_lift(node, cordon, actor)
            logger.info("node %s sees its storage root again: storage cordon lifted", node_id)
            return True
    return False


UNKILLABLE = "a member's processes survived SIGKILL for a minute; its cards stay held"


def node_observe_unkillable(*, node_id: str) -> bool:
    """A member reported unkillable: the system cordons its node, and lifts that cordon once
    no member of the node is unkillable and uncleaned any more (the processes went, or the
    machine was rebooted). Call inside the transaction that stored the report."""
    node = node_locked(node_id)
    stuck = NodeCommand.objects.filter(
        node=node, kind=CommandKind.START, reason="unkillable", cleaned_at__isnull=True
    ).exists()
    cordon = NodeCordon.objects.filter(node=node, source=CordonSource.UNKILLABLE).first()
    actor = Actor.system("unkillable")
    if stuck and cordon is None and node.scheduling_state != SchedulingState.REMOVED:
        cordon_add(node, CordonSource.UNKILLABLE, UNKILLABLE, actor)
        logger.warning("node %s has unkillable processes: cordoned", node_id)
        return True
    if not stuck and cordon is not None:
        cordon_lift(node, cordon, actor)
        logger.info("node %s: no unkillable member left; its cordon lifted", node_id)
        return True
    return False


def node_not_removed(node: Node, verb: str) -> None:
    """D4: a removed node takes no verb."""
    if node.scheduling_state == SchedulingState.REMOVED:
        raise Conflict(
            f"Node '{node.id}' is removed; it cannot be {verb}.", code="node_removed", rule="D4"
        )


def operator_reason(reason, doing: str) -> str:
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
    reason = operator_reason(reason, "cordoned")
    with transaction.atomic():
        node = node_locked(node.pk)
        node_not_removed(node, "cordoned")
        existing = NodeCordon.objects.filter(node=node, source=CordonSource.OPERATOR).first()
        if existing is None:
            cordon_add(node, CordonSource.OPERATOR, reason, actor)
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
    """Lifts the operator's cordon only; a storage cordon stays until the mount returns (L6).
    A draining or drained node without an operator's cordon is leaving, not cordoned: the
    verb that undoes a drain is resume, and uncordon says so (409) rather than doing
    nothing."""
    with transaction.atomic():
        node = node_locked(node.pk)
        node_not_removed(node, "uncordoned")
        cordon = NodeCordon.objects.filter(node=node, source=CordonSource.OPERATOR).first()
        if cordon is not None:
            cordon_lift(node, cordon, actor)
        elif node.scheduling_state in (SchedulingState.DRAINING, SchedulingState.DRAINED):
            raise Conflict(
                f"Node '{node.id}' is {node.scheduling_state}, not cordoned: uncordon does not "
                f"undo a drain. Resume it to take work again (tuneplane resume {node.id}; "
                f"POST /api/nodes/{node.id}/resume) (rule D1).",
                code="node_draining",
                rule="D1",
            )
    return node


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
