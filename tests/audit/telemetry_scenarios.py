"""A1 for GPU health (issue 19, H6, H7): a card going unhealthy, every card of a node (its
gpu-health cordon with them; the breaker opened wide), a card healthy again (the cordon
lifted), the breaker tripping on a fault past its share, an operator's return of a card and
reset of the breaker. Merged into SCENARIOS through run_scenarios."""

from datetime import timedelta

from django.test import override_settings

from audit.services import Actor
from fleets.models import Fleet
from nodes.models import Node, NodeCommand
from nodes.services import checks, control, health
from tests.conftest import H100_DEVICE_INVENTORY, H100_DEVICES

from .scenarios import Scenario, changed, created


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


def _checked_node(w):
    """A placeable node of eight cards on a Fleet with a health check (H5)."""
    node = _node_with_devices(w)
    Fleet.objects.filter(pk=node.fleet_id).update(
        config={"health_check": {"command": "true", "timeout_seconds": 30}}
    )
    return node


def health_checks_sent(w):
    _checked_node(w)
    return checks.health_checks_run


def health_check_timed_out(w):
    """A check past its timeout: stopped (a command), failed and its card quarantined."""
    node = _checked_node(w)
    with WIDE:
        checks.health_checks_run()
    one = NodeCommand.objects.filter(node=node, kind="start").order_by("id").first()
    node.refresh_from_db()
    Node.objects.filter(pk=node.pk).update(
        card_checks={
            uuid: record if record["command"] == one.pk else {**record, "state": "passed"}
            for uuid, record in node.card_checks.items()
        }
    )
    Node.objects.filter(pk=node.pk).update(lease_expires_at=one.created_at + timedelta(days=1))
    later = one.created_at + timedelta(seconds=30)
    return WIDE(lambda: checks.health_checks_run(now=later))


def health_check_failed(w):
    """A check's start ended with exit 1: its card's check failed (audited), the card
    quarantined, the check's cleanup sent."""
    node = _checked_node(w)
    checks.health_checks_run()
    one = NodeCommand.objects.filter(node=node, kind="start").order_by("id").first()
    NodeCommand.objects.filter(pk=one.pk).update(state="failed", exit_code=1)
    one.refresh_from_db()
    return WIDE(lambda: checks.check_command_changed(one, {"state": "running"}))


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
    # H5: a check on each of the node's cards, one command a card.
    "nodes.services.checks.health_checks_run": Scenario(
        health_checks_sent, (*[created("node_command.created")] * len(H100_DEVICES),)
    ),
    "nodes.services.checks.health_checks_run/timed-out": Scenario(
        health_check_timed_out,
        (
            changed("node.card_check"),
            changed("node.card_unhealthy"),
            created("node_command.created"),
        ),
    ),
    "nodes.services.checks.check_command_changed": Scenario(
        health_check_failed,
        (
            changed("node.card_check"),
            changed("node.card_unhealthy"),
            created("node_command.created"),
        ),
    ),
}
