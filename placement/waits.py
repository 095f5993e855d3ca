"""Why a request waits (Q8), decided by the pass that places (placement.decide), never guessed
later: one reason from a closed set, a message with its numbers, and its place in its
project's queue and in the Fleet's.

- ``backoff``: a retry waits until a time.
- ``quota``: its project would pass its limit (use / limit).
- ``capacity``: not enough free cards of its series on the Fleet's placeable nodes (free vs
  needed), or the free ones are owed to a guarantee whose work waits for them, or no node
  has the CPUs, memory, port, runtime (or is not quiet, not excluded) it needs beside its
  cards: then ``shortfall`` names each resource short, with what it asks and the most a
  node has (a 0-card request "needs no cards").
- ``fragmentation``: enough free cards, but not on one node (the largest free block).
- ``cordoned``, ``health``, ``node_unreachable``, ``no_devices``: it would fit with the
  cards of nodes that are cordoned (the cordons' words said: a cordoned machine is coming
  back, P8), of cards that are unhealthy or awaiting their health check (H5), of nodes not
  connected now (quiet, gone, never yet reported), or of nodes that list cards without
  devices (what the allocator cannot hold; Q9). A leaving node — draining or drained —
  counts for none of them.
- ``priority``: its cards went, this pass, to work of its own project ahead of it.
- ``fair_share``: its cards went, this pass, to another project's borrowed work.
- ``preempting``: running jobs are being stopped for it (Q5, Q6): their deadlines.
- ``fleet_closed``: its Fleet is no longer open to its project, no longer promises what it
  needs, or is not active (R22): admission's gates, asked again by the pass that would place
  it. It names which gate, never who the Fleet is open to now.
"""

from dataclasses import dataclass, field
from datetime import datetime

from fleets.choices import FleetState

# The closed set (Q8). ``preempting``: its victims are stopping (placement.services.preempting).
REASONS = (
    "quota",
    "capacity",
    "fragmentation",
    "health",
    "priority",
    "fair_share",
    "backoff",
    "preempting",
    "no_devices",
    "node_unreachable",
    "cordoned",
    "fleet_closed",
)


@dataclass(frozen=True)
class Wait:
    reason: str
    message: str
    numbers: dict = field(default_factory=dict)
    position_in_project: int = 0
    position_in_fleet: int = 0

    def as_record(self) -> dict:
        return {
            "reason": self.reason,
            "message": self.message,
            "numbers": self.numbers,
            "position_in_project": self.position_in_project,
            "position_in_fleet": self.position_in_fleet,
        }


def backoff(not_before: datetime) -> Wait:
    return Wait(
        "backoff",
        f"retried after a backoff: not placed before {not_before.isoformat()}",
        {"not_before": not_before.isoformat()},
    )


def fleet_closed(*, open_to_project: bool, capability: str, promised: bool, state: str):
    """R22: why the pass places nothing of a request on its Fleet, or None when every gate of
    admission still holds for it. Asked in admission's order (visibility, capability, state);
    a Fleet closed to the project says only that — nothing of what it promises now, its state
    or whose it became."""
    if not open_to_project:
        return Wait(
            "fleet_closed",
            "its Fleet is no longer open to its project: nothing of it is placed there (rule R22)",
            {"gate": "visibility"},
        )
    if not promised:
        return Wait(
            "fleet_closed",
            f"its Fleet no longer promises {capability}: nothing of it is placed there (rule R22)",
            {"gate": "capability", "capability": capability},
        )
    if state != FleetState.ACTIVE:
        return Wait(
            "fleet_closed",
            f"its Fleet is {state}: it takes no new work until it is active again (rule R22)",
            {"gate": "state", "state": state},
        )
    return None


def over_limit(held: int, limit: int, needs: int, series: str) -> Wait:
    what = series or "cards"
    return Wait(
        "quota",
        f"its project holds {held} of its limit of {limit} {what} here; this needs {needs}",
        {"in_use": held, "limit": limit, "needs": needs},
    )


def owed(free: int, owed_cards: int, needs: int, series: str) -> Wait:
    what = series or "cards"
    return Wait(
        "capacity",
        f"needs {needs} {what}; {free} free, {owed_cards} of them owed to work waiting within "
        "its guarantee",
        {"needs": needs, "free": free, "owed": owed_cards},
    )


# Capacity the pass cannot use, by why: cards on cordoned nodes (``cordoned``), unhealthy
# (``health``), on nodes not connected (``node_unreachable``), listed without devices
# (``no_devices``). A wait names the first that would make the request fit.
UNAVAILABLE = ("cordoned", "health", "node_unreachable", "no_devices")
UNAVAILABLE_SAID = {
    "cordoned": "on cordoned nodes",
    "health": "unhealthy",
    "node_unreachable": "on nodes not connected now",
    "no_devices": "on nodes that list cards without devices (the agent's inventory must name "
    "each card's index and uuid)",
}
# The cordons' words a ``cordoned`` wait quotes; past this many it says how many more.
CORDONS_SAID = 3
# A storage cordon's source (nodes.choices.CordonSource.STORAGE): the system's, lifted by the
# node itself (L6), which a wait on it says.
STORAGE = "storage"


class Unavailable(dict):
    """A Fleet's cards no pass can use now, by why (reason → cards), and the words of the
    cordons that hold some of them ("source: reason", each once, oldest first)."""

    def __init__(self, cards=None, cordons=(), checking=0):
        super().__init__(cards or {})
        self.cordons = tuple(cordons)
        self.checking = checking  # of the ``health`` cards, those awaiting their check (H5)


@dataclass(frozen=True)
class NodeRow:
    """What a pass reads of one of its Fleet's nodes to say why cards are unavailable."""

    node_id: str
    cards: int  # its placeable cards as its row keeps them (less the unhealthy)
    unhealthy: int = 0
    cordons: tuple[str, ...] = ()  # "source: reason"
    leaving: bool = False  # draining, drained, or a drain not undone
    checking: int = 0  # idle cards awaiting their health check (H5): health's too


def unavailable(rows, capacities) -> Unavailable:
    """Q8, Q9, P8: the Fleet's cards no pass can use now, by why. A node the pass may place
    on (in ``capacities``) lends only its cards without devices; one it may not is cordoned,
    else not connected now; a leaving node counts for nothing. Unhealthy cards are health's
    wherever they are."""
    found = dict.fromkeys(UNAVAILABLE, 0)
    words: dict[str, None] = {}
    checking = 0
    for row in rows:
        if row.leaving:
            continue
        found["health"] += row.unhealthy
        node = capacities.get(row.node_id)
        if node is not None:  # a check runs only where the node takes work
            found["health"] += row.checking
            checking += row.checking
        if node is None and row.cordons:
            found["cordoned"] += row.cards
            if row.cards:
                words.update(dict.fromkeys(row.cordons))
        elif node is None:
            found["node_unreachable"] += row.cards
        elif row.cards and not node.devices_by_series.get("", 0):
            found["no_devices"] += row.cards
    return Unavailable({why: cards for why, cards in found.items() if cards}, words, checking)


def _said_unavailable(reason: str, unavailable: dict) -> tuple[str, dict]:
    """How a wait on unavailable cards names them, and the numbers it adds."""
    cordons = list(getattr(unavailable, "cordons", ()))
    checking = getattr(unavailable, "checking", 0)
    if reason == "health" and checking:
        return (
            f"{UNAVAILABLE_SAID[reason]} or awaiting their health check ({checking} of them, "
            "rule H5)",
            {"checking": checking},
        )
    if reason != "cordoned" or not cordons:
        return UNAVAILABLE_SAID[reason], {}
    more = len(cordons) - CORDONS_SAID
    quoted = "; ".join(cordons[:CORDONS_SAID]) + (f"; and {more} more" if more > 0 else "")
    lifts = (
        "; a storage cordon lifts by itself when its node sees the Fleet's storage root "
        "again (rule L6)"
        if any(cordon.startswith(f"{STORAGE}:") for cordon in cordons)
        else ""
    )
    return f"{UNAVAILABLE_SAID[reason]} ({quoted}){lifts}", {"cordons": cordons}


def unfit(
    request,
    capacities,
    free_at_start: int,
    placed_before: list,
    unavailable: dict[str, int],
    shared: bool = False,
    shortfalls: dict | None = None,
) -> Wait:
    """Why a request the pass tried did not fit: read off what is free after the pass, what
    was free before it, and what the pass placed ahead of it (``shared``: by quotas).
    ``shortfalls``: what the nodes lack by request shape, and the free cards by series, kept
    across one pass's waits (the nodes do not change while they are written)."""
    series, needs = request.series, request.total_cards
    what = series or "cards"
    if shortfalls is None:
        shortfalls = {}
    if ("free", series) not in shortfalls:
        shortfalls["free", series] = sum(len(node.free_of(series)) for node in capacities.values())
    free = shortfalls["free", series]
    if free_at_start >= needs > free and placed_before:
        own = [p for p in placed_before if p.request.project == request.project]
        if own:
            return Wait(
                "priority",
                f"needs {needs} {what}; the {len(own)} placed ahead of it in its project "
                f"took them ({free} free now)",
                {"needs": needs, "free": free, "ahead": len(own)},
            )
        if not shared:  # first come, first served: those admitted before it came first
            return Wait(
                "capacity",
                f"needs {needs} {what}; {len(placed_before)} admitted before it took them "
                f"({free} free now)",
                {"needs": needs, "free": free, "placed_first": len(placed_before)},
            )
        guaranteed = [p for p in placed_before if not p.borrowed]
        if guaranteed:  # other projects' work within their guarantees came first (Q3)
            return Wait(
                "capacity",
                f"needs {needs} {what}; they went to {len(guaranteed)} within other "
                f"projects' guarantees ({free} free now)",
                {"needs": needs, "free": free, "guaranteed_first": len(guaranteed)},
            )
        return Wait(
            "fair_share",
            f"needs {needs} {what}; they went to {len(placed_before)} of other projects "
            f"first by fair share ({free} free now)",
            {"needs": needs, "free": free, "placed_first": len(placed_before)},
        )
    largest, where = max(
        ((len(node.free_of(series)), node_id) for node_id, node in capacities.items()),
        default=(0, ""),
    )
    if request.nodes == 1 and free >= request.cards > largest:
        return Wait(
            "fragmentation",
            f"needs {request.cards} {what} on one node; the largest free block is {largest}"
            + (f" on {where}" if where else ""),
            {"needs": request.cards, "free": free, "largest_block": largest, "node": where},
        )
    if free >= needs and capacities:  # cards are not what is short: say what a node lacks
        if request.shape not in shortfalls:
            shortfalls[request.shape] = shortfall(request, capacities)
        short = shortfalls[request.shape]
        if short:
            return _short(request, needs, what, free, short)
    for reason in UNAVAILABLE:
        if not (needs or not capacities):  # no cards needed, and a node to place on
            break
        if unavailable.get(reason) and free + unavailable[reason] >= needs:
            said, numbers = _said_unavailable(reason, unavailable)
            held = (
                f"needs {needs} {what}; {free} free, {unavailable[reason]} more"
                if needs
                else f"needs no cards, but no node takes work now; {unavailable[reason]} cards"
            )
            return Wait(
                reason,
                f"{held} {said}",
                {"needs": needs, "free": free, reason: unavailable[reason], **numbers},
            )
    if not capacities and not needs:
        return Wait(
            "capacity",
            f"{_needs(needs, what, free)}, but no node of its Fleet takes work now",
            {"needs": needs, "free": free, "nodes": 0},
        )
    if free >= needs:
        return Wait(
            "capacity",
            f"{_needs(needs, what, free)} on nodes with the CPUs, memory, port and runtime it "
            "asks, but none it may take now (kept for work that has waited longer, rule R2)",
            {"needs": needs, "free": free},
        )
    return Wait("capacity", f"needs {needs} {what}; {free} free", {"needs": needs, "free": free})


# What a node may lack of what a request asks, in the order a wait names them (Q8): free
# cards (a gang's, on each of its nodes), CPUs, memory, its served port (S1), a container
# runtime for its image, a node not quiet for its kind of work (L2, L3, S6), a node its
# earlier attempts did not fail on (H2).
RESOURCES = ("cards", "cpus", "memory", "port", "runtime", "quiet", "excluded")
QUIET_FOR = {"quiet_train": "training", "quiet_serve": "serving", "quiet_env": "episodes"}


def lacks(request, node) -> tuple[str, ...]:
    """What one placeable node lacks of what ``request`` asks, of ``RESOURCES``: the same
    tests as placement.decide's ``NodeCapacity.fits``, one by one."""
    cpus, memory = node.given(request)
    return tuple(
        resource
        for resource, enough in (
            ("cards", len(node.free_for(request)) >= request.cards),
            ("cpus", not cpus or node.cpus is None or node.cpus >= cpus - 1e-9),
            ("memory", not memory or node.memory is None or node.memory >= memory),
            ("port", request.port is None or request.port not in node.ports),
            ("runtime", node.runtime or not request.container),
            ("quiet", request.quiet not in node.quiet),
            ("excluded", node.node_id not in request.excluded_nodes),
        )
        if not enough
    )


@dataclass(frozen=True)
class Shortfall:
    """Why no ``nodes`` of a Fleet's placeable ones take a request: the resources short,
    each with its numbers, and whether each is there on some node but never with the rest
    (``apart``)."""

    short: dict  # resource → its numbers, in RESOURCES' order
    apart: bool = False
    nodes: int = 0  # the placeable nodes weighed

    def __bool__(self) -> bool:
        return bool(self.short)


def shortfall(request, capacities) -> Shortfall:
    """Q8: what the Fleet's placeable nodes (``capacities``, as the pass left them) lack for
    ``request``, beside the cards counted across the Fleet. A resource is short when fewer
    than the request's ``nodes`` have enough of it; when each is on enough nodes but never
    all on the same ones, each some node lacks is named (``apart``). Empty when enough
    nodes have all of it (what kept it off them is not a node's: a reservation, R2)."""
    lacking = {node_id: lacks(request, node) for node_id, node in capacities.items()}
    if sum(1 for found in lacking.values() if not found) >= request.nodes:
        return Shortfall({}, nodes=len(lacking))
    short = [
        resource
        for resource in RESOURCES
        if sum(1 for found in lacking.values() if resource not in found) < request.nodes
    ]
    apart = not short
    if apart:
        short = [r for r in RESOURCES if any(r in found for found in lacking.values())]
    return Shortfall(
        {resource: _short_numbers(resource, request, capacities) for resource in short},
        apart,
        len(lacking),
    )


def _short_numbers(resource: str, request, capacities) -> dict:
    """The numbers a wait gives for one resource short: what it asks, and the most a node
    has (and which), or how many nodes have it."""
    nodes = list(capacities.values())
    if resource in ("cpus", "memory"):
        at = 0 if resource == "cpus" else 1
        weighed = []
        for node in nodes:
            has, asks = getattr(node, resource), node.given(request)[at]
            if has is not None and asks:
                weighed.append((has - asks, asks, has, node.node_id))
        # The node closest to taking it: the most left once it has what it asks there.
        _, asked, most, where = max(weighed)
        return {"asks": asked, "most_free": most, "node": where}
    having = sum(1 for node in nodes if resource not in lacks(request, node))
    asked = {
        "cards": request.cards,
        "port": request.port,
        "runtime": True,
        "quiet": request.quiet,
        "excluded": len(request.excluded_nodes),
    }[resource]
    return {"asks": asked, "nodes_with": having}


def _number(value: float, other: float) -> str:
    """A CPU count as a person reads it, with the digits that tell it from ``other``."""
    said = f"{value:g}"
    return said if said != f"{other:g}" else repr(float(value))


def _size(value: int, other: int) -> str:
    """Bytes in GiB (MiB below one), exact where rounding would hide the difference."""
    said = f"{value / 2**30:.3g} GiB" if value >= 2**30 else f"{value / 2**20:.3g} MiB"
    other_said = f"{other / 2**30:.3g} GiB" if other >= 2**30 else f"{other / 2**20:.3g} MiB"
    return said if said != other_said else f"{value} bytes"


def _short_said(resource: str, numbers: dict, request, what: str, nodes: int) -> str:
    asks = numbers["asks"]
    if resource == "cpus":
        most = numbers["most_free"]
        cpus = "CPU" if asks == 1 else "CPUs"
        return (
            f"{_number(asks, most)} {cpus} (the most free on a node is {_number(most, asks)}, "
            f"on {numbers['node']})"
        )
    if resource == "memory":
        most = numbers["most_free"]
        return (
            f"{_size(asks, most)} of memory (the most free on a node is {_size(most, asks)}, "
            f"on {numbers['node']})"
        )
    having = numbers["nodes_with"]
    if resource == "cards":
        return f"{asks} {what} free on each of {request.nodes} nodes ({having} have them)"
    if resource == "port":
        return f"port {asks} free (in use on {nodes - having} of {nodes} nodes)"
    if resource == "runtime":
        return f"a container runtime for its image ({having} of {nodes} nodes have one)"
    if resource == "quiet":
        return (
            f"a node not quiet for {QUIET_FOR.get(asks, asks)} ({nodes - having} of {nodes} "
            "are quiet)"
        )
    return f"a node its earlier attempts did not fail on (rule H2; {asks} excluded)"


def _needs(needs: int, what: str, free: int) -> str:
    return f"needs {needs} {what}; {free} free" if needs else "needs no cards"


# How a wait names each resource short, in a list.
SHORT_SAID = {
    "cpus": "CPUs",
    "memory": "memory",
    "port": "a free port",
    "runtime": "a container runtime",
    "quiet": "a node not quiet",
    "excluded": "a node not excluded",
}


def _short(request, needs: int, what: str, free: int, found: Shortfall) -> Wait:
    """A ``capacity`` wait on what the nodes lack beside the Fleet's free cards: each
    resource short named, with what it asks and the most a node has."""
    short = list(found.short)
    names = [SHORT_SAID.get(resource, what) for resource in short]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    head = (
        f"no node has all it asks at once ({listed}: each on some node, never together)"
        if found.apart
        else f"no node has enough {listed}"
    )
    said = "; ".join(
        _short_said(resource, numbers, request, what, found.nodes)
        for resource, numbers in found.short.items()
    )
    return Wait(
        "capacity",
        f"{_needs(needs, what, free)}, but {head}: it asks {said}",
        {"needs": needs, "free": free, "short": short, "apart": found.apart, **found.short},
    )


def positioned(waits: dict, requests) -> dict:
    """Each wait with its place in its project's queue (priority, then admission order) and
    in the Fleet's (admission order), counting only what still waits."""
    waiting = [r for r in requests if r.key in waits]
    in_fleet = {r.key: n for n, r in enumerate(sorted(waiting, key=lambda r: r.order), 1)}
    in_project: dict = {}
    counts: dict[int, int] = {}
    for r in sorted(waiting, key=lambda r: (-r.priority, r.order)):
        counts[r.project] = counts.get(r.project, 0) + 1
        in_project[r.key] = counts[r.project]
    return {
        key: Wait(
            wait.reason,
            wait.message,
            wait.numbers,
            in_project.get(key, 0),
            in_fleet.get(key, 0),
        )
        for key, wait in waits.items()
    }
