"""A node's cards' health, as its telemetry judged it (telemetry.judge): each change written
with its audit event, in one transaction.

An unhealthy card is taken out of new work at once — the node's placeable cards (its card
summary, which admission reads, and the devices the allocator holds) drop by it — and the
rest of the node keeps working. A node whose every card is unhealthy gets the system's
``gpu-health`` cordon, lifted by itself when a card is healthy again; an operator's cordon
is another record, never touched here (L6). Nothing running is stopped (D1).
"""

import logging

from django.db import transaction

from audit.services import Actor, audit_record

from ..choices import CordonSource, SchedulingState
from ..models import Node, NodeCordon
from ..selectors import cards_summary
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


def node_cards_health(*, node_id: str, unhealthy: dict, healthy: dict) -> Node:
    """Cards become unhealthy (``{uuid: {"index", "name", "reason", "since"}}``) or healthy
    again (``{uuid: why}``): one audit event per card that changed, the node's placeable
    cards recomputed, its gpu-health cordon set or lifted as every card is unhealthy or not."""
    with transaction.atomic():
        node = Node.objects.select_for_update(no_key=True).get(pk=node_id)
        if node.scheduling_state == SchedulingState.REMOVED:
            return node
        cards = dict(node.unhealthy_cards)
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
        node.save(update_fields=["unhealthy_cards", "series_cards", "card_count"])
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
    return node


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
