"""A Fleet's health breaker as the API and the admin show it (H7): tripped or not and why,
its limit now, the automatic quarantines its window counts, and the latest card faults —
quarantined, or recorded only while it was tripped. A few queries, whatever the Fleet."""

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from . import quarantine
from .choices import SchedulingState
from .models import CardFault, HealthBreaker, Node

LATEST_FAULTS = 20


def fleet_card_total(fleet_id: str) -> int:
    """The cards of a Fleet's machines (not removed), quarantined or not: what the breaker's
    share is of."""
    return sum(
        len((inventory or {}).get("devices") or [])
        for inventory in Node.objects.filter(fleet_id=fleet_id)
        .exclude(scheduling_state=SchedulingState.REMOVED)
        .values_list("inventory", flat=True)
    )


def quarantined_in_window(fleet_id: str, reset_at, now) -> set:
    """H7: the Fleet's cards, as (node, uuid), its breaker counts now (nodes.quarantine.
    in_window on the rows): quarantined automatically less than a window ago, from its last
    reset on."""
    window = timedelta(seconds=settings.TUNEPLANE_HEALTH_BREAKER_WINDOW)
    recent = CardFault.objects.filter(fleet_id=fleet_id, quarantined=True, at__gt=now - window)
    if reset_at is not None:
        recent = recent.filter(at__gte=reset_at)
    return set(recent.values_list("node_id", "uuid").distinct())


def health_breaker_of(fleet_id: str, now=None) -> dict:
    now = now or timezone.now()
    breaker = HealthBreaker.objects.filter(fleet_id=fleet_id).first() or HealthBreaker(
        fleet_id=fleet_id
    )
    cards = fleet_card_total(fleet_id)
    return {
        "fleet": fleet_id,
        "tripped": breaker.tripped,
        "tripped_at": breaker.tripped_at,
        "tripped_reason": breaker.tripped_reason,
        "reset_at": breaker.reset_at,
        "share": settings.TUNEPLANE_HEALTH_BREAKER_SHARE,
        "window_seconds": settings.TUNEPLANE_HEALTH_BREAKER_WINDOW,
        "cards": cards,
        "limit": quarantine.breaker_limit(cards, settings.TUNEPLANE_HEALTH_BREAKER_SHARE),
        "quarantined_in_window": len(quarantined_in_window(fleet_id, breaker.reset_at, now)),
        "faults": list(CardFault.objects.filter(fleet_id=fleet_id)[:LATEST_FAULTS]),
    }


def tripped_breakers(fleet_ids=None) -> list[HealthBreaker]:
    """The tripped breakers (of these Fleets): what the admin's banner and the metric name."""
    breakers = HealthBreaker.objects.filter(tripped_at__isnull=False)
    if fleet_ids is not None:
        breakers = breakers.filter(fleet_id__in=list(fleet_ids))
    return list(breakers.order_by("fleet_id"))


def fleet_health_section(fleet) -> dict | None:
    """The Fleet page's health section (H6, H7): a banner while its breaker is tripped, and its
    latest card faults; nothing for a Fleet that never had one."""
    if fleet.kind != "node":
        return None
    shown = health_breaker_of(fleet.pk)
    if not shown["tripped"] and not shown["faults"]:
        return None
    return {"template": "admin/nodes/fleet_health.html", **shown}
