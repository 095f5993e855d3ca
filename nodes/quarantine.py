"""When a card fails (DESIGN §9, H6, H7): whether a fault quarantines it, what the member on
it does, and when it comes back — pure functions of plain data, with no database and no
clock of their own (tests/nodes/test_quarantine.py). nodes.services.health reads the rows,
asks here, and writes the answer, audited.

H7, the circuit breaker: within any window of TUNEPLANE_HEALTH_BREAKER_WINDOW seconds, the
cards of a Fleet quarantined automatically are at most its limit — TUNEPLANE_HEALTH_BREAKER_SHARE
of its cards, rounded down, but never less than one card (a Fleet may always lose one card);
a card quarantined twice in the window is one card. The
fault that would pass the limit is recorded and shown but not quarantined, and it trips the
breaker: from then on no fault is quarantined automatically until an operator resets it.
Quarantines before the last reset are not counted.
"""

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

STOP, CONTINUE = "stop", "continue"
ON_CARD_FAULT = (STOP, CONTINUE)
HEALTH_RETURNS_AFTER = 2


def breaker_limit(total_cards: int, share) -> int:
    """H7: how many of a Fleet's ``total_cards`` may be quarantined automatically within one
    window: ``share`` of them rounded down (exactly, not in binary floating point), at least
    one; none of none."""
    if total_cards <= 0:
        return 0
    return max(1, math.floor(Decimal(str(share)) * total_cards))


def in_window(quarantined: list[tuple], now: datetime, window: timedelta, since=None) -> set:
    """The cards the breaker counts now, of ``(at, card)`` automatic quarantines: those less
    than ``window`` old (one exactly ``window`` old has left it), from the breaker's last
    reset (``since``) on. A card quarantined twice counts once: it is one of the cards."""
    return {
        card for at, card in quarantined if now - at < window and (since is None or at >= since)
    }


@dataclass(frozen=True)
class Decision:
    """H7: of the new faults' cards, those quarantined (in order), and whether the breaker
    trips now (the others are recorded only)."""

    quarantine: tuple
    trips: bool


def breaker_decide(
    *, tripped: bool, total_cards: int, counted: set, faults: list, share
) -> Decision:
    """H7: faults on the cards ``faults`` (in order) on a Fleet of ``total_cards`` whose
    breaker is ``tripped`` or not, with the cards ``counted`` in the window already. A card
    counted already is quarantined again without taking room; a new one while there is room;
    the first that finds none trips the breaker."""
    if tripped:
        return Decision((), False)
    room = max(0, breaker_limit(total_cards, share) - len(counted))
    taken: list = []
    trips = False
    for card in dict.fromkeys(faults):
        if card in counted:
            taken.append(card)
        elif room > 0:
            taken.append(card)
            room -= 1
        else:
            trips = True
    return Decision(tuple(taken), trips)


def on_card_fault(config: dict, serving: bool) -> str:
    """H6: whether a member on a card just quarantined is stopped: the Fleet's config's
    ``on_card_fault``, else ``stop`` for training (a job's attempt, a session, an episode) and
    ``continue`` for serving (a deployment's replica)."""
    said = (config or {}).get("on_card_fault")
    if said in ON_CARD_FAULT:
        return said
    return CONTINUE if serving else STOP


def health_returns_after(config: dict) -> int:
    """H6: how many healthy samples in a row a quarantined card needs to return."""
    value = (config or {}).get("health_returns_after")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return HEALTH_RETURNS_AFTER


def returns(*, passes: int, needed: int, quiet_for: timedelta | None, quiet: timedelta) -> bool:
    """H6: a quarantined card returns after ``needed`` healthy samples in a row and no fault
    for ``quiet`` (``quiet_for`` None: no fault known)."""
    return passes >= needed and (quiet_for is None or quiet_for >= quiet)
