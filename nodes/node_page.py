"""A node's admin page (issue 49): its cards one by one, why it takes no new work, its drain,
what runs there, and the verbs an operator has — instead of its fields one after another.

A higher app adds a section (placement: the members that run there) the way it adds one to
the Fleet page (fleets.page): a function ``(node) -> dict | None``, the context of its
template under ``template``, so that this app never imports it.
"""

from collections.abc import Callable

from . import checks
from .choices import CordonSource, SchedulingState
from .selectors import card_series, work_left_on

Section = Callable[["Node"], dict | None]  # noqa: F821 - the model, by name only

_sections: list[Section] = []

# The verbs of the node list's admin actions, in the order the page offers them.
VERBS = ("cordon", "uncordon", "drain", "resume", "remove")
DRAIN_STATES = (SchedulingState.DRAINING, SchedulingState.DRAINED)


def register_node_page_section(section: Section) -> Section:
    if section not in _sections:
        _sections.append(section)
    return section


def node_page_sections(node) -> list[dict]:
    return [shown for section in _sections if (shown := section(node)) is not None]


def verbs_offered(state: str, operator_cordon: bool, draining: bool) -> dict[str, str]:
    """Each verb and why it is not offered now ("" when it is), as the services would answer
    (D1–D4, L6): a removed node takes none; uncordon lifts the operator's cordon only;
    resume undoes a drain; only a drained or gone node is removed."""
    if state == SchedulingState.REMOVED:
        return dict.fromkeys(VERBS, "the node is removed (D4)")
    leaving = draining or state in DRAIN_STATES
    return {
        "cordon": "",
        "uncordon": "" if operator_cordon else "no operator's cordon to lift",
        "drain": "draining or drained already" if leaving else "",
        "resume": "" if leaving else "no drain to undo",
        "remove": ""
        if state in (SchedulingState.DRAINED, SchedulingState.GONE)
        else "drain it first: only a drained or gone node is removed (D2, D3)",
    }


def node_cards(node) -> list[dict]:
    """Each card the node reports, by index: its UUID, name, hardware series (None while
    unmapped, J4), health — quarantined with the reason and since when (H6) — and its last
    health check, where its Fleet has one (H5)."""
    devices = sorted(node.inventory.get("devices") or [], key=lambda device: device["index"])
    series = card_series(device["name"] for device in devices)
    unhealthy = node.unhealthy_cards or {}
    card_checks = node.card_checks or {}
    cards = []
    for device in devices:
        sick = unhealthy.get(device["uuid"])
        cards.append(
            {
                "index": device["index"],
                "uuid": device["uuid"],
                "name": device["name"],
                "series": series.get(device["name"]),
                "healthy": sick is None,
                "reason": sick["reason"] if sick else "",
                "since": str(sick.get("since") or "")[:19].replace("T", " ") if sick else "",
                "check": checks.shown(card_checks.get(device["uuid"])),  # H5
            }
        )
    return cards


def node_page(node) -> dict:
    """The page's context: cards, cordons, drain (with what it still waits for), the verbs,
    the sections of higher apps. A handful of queries whatever the node carries."""
    cordons = list(node.cordons.all())
    drain = None
    if node.drain_started_at is not None:
        left = work_left_on([node.pk]).get(node.pk, {})
        drain = {
            "reason": node.drain_reason,
            "by": node.drain_by,
            "at": node.drain_started_at,
            "deadline": node.drain_deadline,
            "overdue": node.drain_overdue_at is not None,
            "work_left": sorted((kind, len(ids)) for kind, ids in left.items()),
        }
    offered = verbs_offered(
        node.scheduling_state,
        any(cordon.source == CordonSource.OPERATOR for cordon in cordons),
        node.drain_started_at is not None,
    )
    return {
        "shown_state": node.scheduling_shown(cordons),
        "cards": node_cards(node),
        "cordons": cordons,
        "drain": drain,
        "verbs": [{"verb": verb, "not_now": offered[verb]} for verb in VERBS],
        "sections": node_page_sections(node),
    }
