"""A node's telemetry as the API and the Fleet page show it: the latest sample with its
observation time, each card with its health (and why, when unhealthy), and stale when no
sample came for the refresh period and two intervals more — shown as stale, with the last
values and when, never as zeros."""

from datetime import timedelta

from django.conf import settings

from . import checks
from .agent.wire import TELEMETRY_REFRESH_INTERVALS
from .models import NodeTelemetry

# A node sends a sample when its figures move and at least every refresh (the agent's
# telemetry.Reporter): a steady node is silent in between, and its figures are not stale.
# Two intervals of grace: a probe slow or failed once, a gateway's flush.
STALE_AFTER_INTERVALS = TELEMETRY_REFRESH_INTERVALS + 2


def telemetry_of(node_ids) -> dict[str, NodeTelemetry]:
    """The latest sample of each node, in one query."""
    return {row.node_id: row for row in NodeTelemetry.objects.filter(node_id__in=list(node_ids))}


def _stale(at, now) -> bool:
    window = timedelta(seconds=STALE_AFTER_INTERVALS * settings.TUNEPLANE_TELEMETRY_INTERVAL)
    return at is None or now - at > window


def telemetry_shown(node, row: NodeTelemetry | None, now) -> dict | None:
    """None when the node never sent telemetry."""
    unhealthy = node.unhealthy_cards or {}
    card_checks = node.card_checks or {}
    if row is None:
        return None
    cards = []
    for card in row.cards:
        sick = unhealthy.get(card["uuid"])
        cards.append(
            {
                **{key: value for key, value in card.items() if key != "fault_at"},
                "memory_used_ratio": round(
                    card["memory_used_bytes"] / card["memory_total_bytes"], 3
                )
                if card.get("memory_total_bytes")
                else None,
                "health": "unhealthy" if sick else "healthy",
                "health_reason": sick["reason"] if sick else "",
                "unhealthy_since": sick["since"] if sick else None,
                "health_check": checks.shown(card_checks.get(card["uuid"])),  # H5
            }
        )
    return {
        "observed_at": row.observed_at,
        "stale": _stale(row.observed_at, now),
        "source": row.source or None,
        "cards_observed_at": row.cards_observed_at,
        "cards_stale": _stale(row.cards_observed_at, now),
        "host": row.host,
        "cards": cards,
        "unhealthy_cards": sum(1 for card in cards if card["health"] == "unhealthy"),
    }
