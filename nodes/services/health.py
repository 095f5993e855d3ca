"""A node's cards' health, as its telemetry judged it (telemetry.judge): each change written
with its audit event, in one transaction (DESIGN §9, H6, H7).

H6. A card that fails is quarantined at the flush of the sample that shows it (every
TUNEPLANE_TELEMETRY_INTERVAL, 15 s, flushed every 2 s: well within a minute): taken out of
new work at once — the node's placeable cards (its card summary, which admission reads, and
the devices the allocator holds) drop by it — with its reason, and the rest of the node keeps
working. A member running on it is stopped (SIGTERM, through the members' stop path) when
its Fleet's ``on_card_fault`` says ``stop`` (by default for training; serving continues). A
node whose every card is quarantined gets the system's ``gpu-health`` cordon, lifted by
itself when a card returns; an operator's cordon is another record, never touched here
(L6). A card returns after ``health_returns_after`` healthy samples in a row, or when an
operator returns it (card_return).

H7. Each automatic quarantine is asked of its Fleet's breaker first (nodes.quarantine): the
fault that would pass the limit is recorded (CardFault, shown) but not quarantined, and
trips the breaker until an operator resets it (health_breaker_reset).
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.services import Actor, audit_record
from tuneplane.errors import Conflict

from .. import checks, quarantine
from ..choices import ACTIVE_COMMAND_STATES, CommandKind, CordonSource, SchedulingState
from ..health_shown import fleet_card_total, quarantined_in_window
from ..models import CardFault, HealthBreaker, Node, NodeCommand, NodeCordon
from ..selectors import cards_summary
from .commands import node_commands_create_many
from .cordons import cordon_add, cordon_lift

logger = logging.getLogger("tuneplane.nodes")

GPU_HEALTH = Actor.system("gpu-health")
MAX_REASON = 200


def _cordon_reason(unhealthy: dict) -> str:
    cards = "; ".join(
        f"{card['index']}: {card['reason']}"
        for card in sorted(unhealthy.values(), key=lambda c: c["index"])
    )
    return f"every card unhealthy ({cards})"[:MAX_REASON]


def health_breakers_lock(fleet_ids) -> dict[str, HealthBreaker]:
    """H7: the breakers of these Fleets, made where missing and locked in one order — what a
    flush takes before any node it quarantines on, so that two flushes never wait in turn."""
    fleet_ids = sorted({fleet_id for fleet_id in fleet_ids if fleet_id})
    HealthBreaker.objects.bulk_create(
        [HealthBreaker(fleet_id=fleet_id) for fleet_id in fleet_ids], ignore_conflicts=True
    )
    return {
        breaker.fleet_id: breaker
        for breaker in HealthBreaker.objects.select_for_update()
        .filter(fleet_id__in=fleet_ids)
        .order_by("fleet_id")
    }


def _breaker_admits(node: Node, unhealthy: dict, now) -> dict:
    """H7: which of the faults ``unhealthy`` (new on ``node``) are quarantined: recorded all,
    as CardFault rows; the breaker tripped (audited) by the first the limit refuses."""
    if not unhealthy or node.fleet_id is None:
        return unhealthy
    breaker = health_breakers_lock([node.fleet_id])[node.fleet_id]
    window = timedelta(seconds=settings.TUNEPLANE_HEALTH_BREAKER_WINDOW)
    share = settings.TUNEPLANE_HEALTH_BREAKER_SHARE
    total = fleet_card_total(node.fleet_id)
    ordered = sorted(unhealthy.items(), key=lambda item: item[1]["index"])
    decision = quarantine.breaker_decide(
        tripped=breaker.tripped,
        total_cards=total,
        counted=quarantined_in_window(node.fleet_id, breaker.reset_at, now),
        faults=[(node.id, uuid) for uuid, _ in ordered],
        share=share,
    )
    taken = {uuid: card for uuid, card in ordered if (node.id, uuid) in decision.quarantine}
    shown = {uuid: card for uuid, card in ordered if uuid not in taken}
    already = set()
    if shown and breaker.tripped_at is not None:
        already = set(
            CardFault.objects.filter(
                node=node, quarantined=False, at__gte=breaker.tripped_at
            ).values_list("uuid", "reason")
        )
    CardFault.objects.bulk_create(
        [
            CardFault(
                node=node,
                fleet_id=node.fleet_id,
                uuid=uuid,
                index=card["index"],
                reason=card["reason"][:MAX_REASON],
                at=now,
                quarantined=uuid in taken,
            )
            for uuid, card in ordered
            if uuid in taken or (uuid, card["reason"][:MAX_REASON]) not in already
        ]
    )
    if decision.trips:
        limit = quarantine.breaker_limit(total, share)
        breaker.tripped_at = now
        breaker.tripped_reason = (
            f"{limit} of {total} cards quarantined within {window.total_seconds():g} s, "
            f"the most share {share:g} allows; card {next(iter(shown.values()))['index']} "
            f"of {node.id} not quarantined"
        )[:MAX_REASON]
        breaker.save(update_fields=["tripped_at", "tripped_reason"])
        audit_record(
            actor=GPU_HEALTH,
            action="fleet.health_breaker_tripped",
            target=breaker.fleet,
            before={"health_breaker": "closed"},
            after={"health_breaker": "tripped", "reason": breaker.tripped_reason},
        )
        logger.warning(
            "fleet %s: health breaker tripped: %s", node.fleet_id, breaker.tripped_reason
        )
    for card in shown.values():
        logger.warning(
            "node %s: card %s fault not quarantined (health breaker tripped): %s",
            node.id,
            card["index"],
            card["reason"],
        )
    return taken


def node_cards_health(
    *, node_id: str, unhealthy: dict, healthy: dict, now=None, owe_checks: bool = True
) -> Node:
    """Cards fail (``{uuid: {"index", "name", "reason", "since"}}``) or are healthy again
    (``{uuid: why}``): a failed card quarantined as its Fleet's breaker admits (H7), one audit
    event per card that changed, the node's placeable cards recomputed, its gpu-health cordon
    set or lifted as every card is quarantined or not, and the members on a card just
    quarantined stopped as their Fleet says (H6). A card quarantined owes a health check
    (H5, where its Fleet has one: its passes count from now), but for ``owe_checks`` False —
    the check's own failure. A caller holding nodes locks the Fleets' breakers first
    (health_breakers_lock)."""
    now = now or timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update(no_key=True).get(pk=node_id)
        if node.scheduling_state == SchedulingState.REMOVED:
            return node
        cards = dict(node.unhealthy_cards)
        unhealthy = _breaker_admits(
            node, {uuid: card for uuid, card in unhealthy.items() if uuid not in cards}, now
        )
        events = []  # (action, before, after) of one card each
        for uuid, card in unhealthy.items():
            if uuid not in cards:
                cards[uuid] = card
                healthy_view = {"uuid": uuid, "index": card["index"], "health": "healthy"}
                sick_view = {"uuid": uuid, **card, "health": "unhealthy"}
                events.append(("node.card_unhealthy", healthy_view, sick_view))
        for uuid, why in healthy.items():
            if uuid in cards:
                was = cards.pop(uuid)
                sick_view = {"uuid": uuid, **was, "health": "unhealthy"}
                healthy_view = {
                    "uuid": uuid,
                    "index": was["index"],
                    "health": "healthy",
                    "why": why,
                }
                events.append(("node.card_healthy", sick_view, healthy_view))
        if not events:
            return node
        node.unhealthy_cards = cards
        for name, value in cards_summary(node.inventory, unhealthy=cards).items():
            setattr(node, name, value)
        fields = ["unhealthy_cards", "series_cards", "card_count"]
        if owe_checks and any(uuid in node.card_checks for uuid in unhealthy):
            node.card_checks = {
                uuid: checks.owed(record, now) if uuid in unhealthy else record
                for uuid, record in node.card_checks.items()
            }
            fields.append("card_checks")
        node.save(update_fields=fields)
        for action, before, after in events:
            audit_record(
                actor=GPU_HEALTH,
                action=action,
                target=node,
                before={"card": before},
                after={"card": after},
            )
            logger.warning(
                "node %s: card %s %s: %s",
                node_id,
                after["index"],
                after["health"],
                after.get("reason") or after.get("why"),
            )
        _cordon_follows(node, cards)
        if unhealthy:
            _members_on_faulted_cards_stop(node, unhealthy)
    return node


def _members_on_faulted_cards_stop(node: Node, faulted: dict) -> None:
    """H6: each live member holding a card of ``faulted`` — its start command, pending or
    running, whose cards name it — stopped where its Fleet's on_card_fault says ``stop``: the
    same ``stop`` command the members' stop path sends (SIGTERM, SIGKILL after the grace,
    R10), once; placement follows the member's end in the node's report, as for any stop.
    Audited per member (node.card_fault_member), whatever the Fleet says."""
    config = node.fleet.config if node.fleet_id else {}
    starts = NodeCommand.objects.filter(
        node=node, kind=CommandKind.START, state__in=ACTIVE_COMMAND_STATES
    ).order_by("created_at")
    stopped = {
        payload.get("member")
        for payload in NodeCommand.objects.filter(node=node, kind=CommandKind.STOP).values_list(
            "payload", flat=True
        )
    }
    stops = []
    for start in starts:
        held = [c for c in start.payload.get("cards") or [] if c.get("uuid") in faulted]
        if not held or start.id in stopped or start.payload.get("health_check"):
            continue  # a health check is no member: its own timeout stops it (H5)
        labels = start.payload.get("labels") or {}
        policy = quarantine.on_card_fault(config, serving="TUNEPLANE_DEPLOYMENT" in labels)
        audit_record(
            actor=GPU_HEALTH,
            action="node.card_fault_member",
            target=node,
            before={"member": start.id, "on_card_fault": policy},
            after={
                "member": start.id,
                "cards": sorted(c["index"] for c in held),
                "reason": "; ".join(faulted[c["uuid"]]["reason"] for c in held)[:MAX_REASON],
                "on_card_fault": policy,
                "stopped": policy == quarantine.STOP,
            },
        )
        if policy == quarantine.STOP:
            stops.append(
                (
                    node.id,
                    CommandKind.STOP,
                    {"member": start.id, "grace_seconds": settings.TUNEPLANE_STOP_GRACE},
                )
            )
            logger.warning(
                "node %s: member %s on quarantined card(s) %s stopped",
                node.id,
                start.id,
                [c["index"] for c in held],
            )
    if stops:
        node_commands_create_many(actor=GPU_HEALTH, commands=stops)


def card_return(*, node_id: str, uuid: str, actor: Actor) -> Node:
    """H6: an operator returns a quarantined card to service (audited); the node's placeable
    cards and its gpu-health cordon follow. A card not quarantined is a Conflict."""
    with transaction.atomic():
        node = Node.objects.select_for_update(no_key=True).get(pk=node_id)
        cards = dict(node.unhealthy_cards)
        if uuid not in cards:
            raise Conflict(f"Card {uuid!r} of node {node_id} is not quarantined (H6).", rule="H6")
        was = cards.pop(uuid)
        node.unhealthy_cards = cards
        for name, value in cards_summary(node.inventory, unhealthy=cards).items():
            setattr(node, name, value)
        node.save(update_fields=["unhealthy_cards", "series_cards", "card_count"])
        audit_record(
            actor=actor,
            action="node.card_returned",
            target=node,
            before={"card": {"uuid": uuid, **was, "health": "unhealthy"}},
            after={"card": {"uuid": uuid, "index": was["index"], "health": "healthy"}},
        )
        _cordon_follows(node, cards)
    return node


def health_breaker_reset(*, fleet_id: str, actor: Actor) -> HealthBreaker:
    """H7: an operator resets a Fleet's health breaker (audited): automatic quarantine runs
    again, counting only quarantines from now on. Resetting one not tripped is a Conflict."""
    with transaction.atomic():
        breaker = health_breakers_lock([fleet_id])[fleet_id]
        if not breaker.tripped:
            raise Conflict(f"Fleet {fleet_id}'s health breaker is not tripped (H7).", rule="H7")
        was = breaker.tripped_reason
        breaker.tripped_at = None
        breaker.tripped_reason = ""
        breaker.reset_at = timezone.now()
        breaker.save(update_fields=["tripped_at", "tripped_reason", "reset_at"])
        audit_record(
            actor=actor,
            action="fleet.health_breaker_reset",
            target=breaker.fleet,
            before={"health_breaker": "tripped", "reason": was},
            after={"health_breaker": "closed"},
        )
    return breaker


def _cordon_follows(node: Node, unhealthy: dict) -> None:
    devices = [device["uuid"] for device in node.inventory.get("devices") or []]
    every = bool(devices) and all(uuid in unhealthy for uuid in devices)
    cordon = NodeCordon.objects.filter(node=node, source=CordonSource.GPU_HEALTH).first()
    if every and cordon is None:
        cordon_add(node, CordonSource.GPU_HEALTH, _cordon_reason(unhealthy), GPU_HEALTH)
        logger.warning("node %s: every card unhealthy: cordoned", node.id)
    elif not every and cordon is not None:
        cordon_lift(node, cordon, GPU_HEALTH)
        logger.info("node %s: a card is healthy again: gpu-health cordon lifted", node.id)
