"""A1 for GPU health (issue 19): a card going unhealthy, every card of a node (its
gpu-health cordon with them), and a card healthy again (the cordon lifted). Merged into
SCENARIOS through run_scenarios."""

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


def every_card_unhealthy(w):
    node = _node_with_devices(w)
    return lambda: health.node_cards_health(
        node_id=node.id, unhealthy=_sick(H100_DEVICES), healthy={}
    )


def card_healthy_again(w):
    node = _node_with_devices(w)
    health.node_cards_health(node_id=node.id, unhealthy=_sick(H100_DEVICES), healthy={})
    return lambda: health.node_cards_health(
        node_id=node.id, unhealthy={}, healthy={H100_DEVICES[0]["uuid"]: "no fault for 300 s"}
    )


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
}
