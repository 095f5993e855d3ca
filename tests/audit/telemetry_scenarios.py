"""A1 for GPU health (issue 19, H6, H7): a card going unhealthy, every card of a node (its
gpu-health cordon with them; the breaker opened wide), a card healthy again (the cordon
lifted), the breaker tripping on a fault past its share, an operator's return of a card and
reset of the breaker. Merged into SCENARIOS through run_scenarios."""

from django.test import override_settings

from audit.services import Actor
from nodes.services import control, health
from tests.conftest import H100_DEVICE_INVENTORY, H100_DEVICES

from .scenarios import Scenario, changed


def _sick(devices) -> dict:
    return {
        d["uuid"]: {"index": d["index"], "name": d["name"], "reason": "XID 79", "since": "now"}
        for d in devices
    }


def _node_with_devices(w):
    node = w.placeable()
    control.node_report_inventory(node_id=node.id, inventory=H100_DEVICE_INVENTORY)
    return node


def card_unhealthy(w):
    node = _node_with_devices(w)
    return lambda: health.node_cards_health(
        node_id=node.id, unhealthy=_sick(H100_DEVICES[:1]), healthy={}
    )


# H7 out of the way: every card of one node is past any share but 1.
WIDE = override_settings(TUNEPLANE_HEALTH_BREAKER_SHARE=1)


def every_card_unhealthy(w):
    node = _node_with_devices(w)
    return WIDE(
        lambda: health.node_cards_health(node_id=node.id, unhealthy=_sick(H100_DEVICES), healthy={})
    )


def card_healthy_again(w):
    node = _node_with_devices(w)
    with WIDE:
        health.node_cards_health(node_id=node.id, unhealthy=_sick(H100_DEVICES), healthy={})
    return lambda: health.node_cards_health(
        node_id=node.id, unhealthy={}, healthy={H100_DEVICES[0]["uuid"]: "no fault for 300 s"}
    )


def breaker_trips(w):
    """Two faults on a Fleet of eight cards: one quarantined (20 % of 8, at least one), the
    other recorded only, the breaker tripped."""
    node = _node_with_devices(w)
    return lambda: health.node_cards_health(
        node_id=node.id, unhealthy=_sick(H100_DEVICES[:2]), healthy={}
    )


def card_returned(w):
    node = _node_with_devices(w)
    health.node_cards_health(node_id=node.id, unhealthy=_sick(H100_DEVICES[:1]), healthy={})
    return lambda: health.card_return(
        node_id=node.id, uuid=H100_DEVICES[0]["uuid"], actor=Actor.of_user(w.admin)
    )


def breaker_reset(w):
    node = _node_with_devices(w)
    health.node_cards_health(node_id=node.id, unhealthy=_sick(H100_DEVICES[:2]), healthy={})
    return lambda: health.health_breaker_reset(fleet_id=node.fleet_id, actor=Actor.of_user(w.admin))


SCENARIOS = {
    "nodes.services.health.node_cards_health": Scenario(
        card_unhealthy, (changed("node.card_unhealthy"),)
    ),
    # One event per card, and the system's gpu-health cordon once every card is unhealthy.
    "nodes.services.health.node_cards_health/every-card": Scenario(
        every_card_unhealthy,
        (*[changed("node.card_unhealthy")] * len(H100_DEVICES), changed("node.cordoned")),
    ),
    "nodes.services.health.node_cards_health/healthy-again": Scenario(
        card_healthy_again, (changed("node.card_healthy"), changed("node.uncordoned"))
    ),
    # H7: the fault past the share is recorded, not quarantined, and trips the breaker.
    "nodes.services.health.node_cards_health/breaker-trips": Scenario(
        breaker_trips, (changed("fleet.health_breaker_tripped"), changed("node.card_unhealthy"))
    ),
    "nodes.services.health.card_return": Scenario(card_returned, (changed("node.card_returned"),)),
    "nodes.services.health.health_breaker_reset": Scenario(
        breaker_reset, (changed("fleet.health_breaker_reset"),)
    ),
}
