"""The allocator's decision, as a pure function of plain data (R1–R3, R5, S1, S5).

``decide`` takes the requests of one node Fleet — every job, replica, playground session and
episode waiting for cards, as one typed ``Request`` each — and what each placeable node has
free (``NodeCapacity``), and answers which requests get which cards on which nodes. It reads
no database and writes nothing: placement.services.allocator reads the rows under the Fleet's
lock, calls it, and writes what it decided. So every rule it keeps is tested without a
database (tests/placement/test_decide.py, with property tests):

- a card goes to one request at a time, and a node never gives more than it has: cards,
  CPUs, memory (R1, R5), a served port once (S1); a request that names no CPUs or memory
  gets its cards' share of the node's budgets, or 1 CPU and 2 GiB with no cards (R16); a
  gang's rendezvous port is one of its rank 0's node's free ports, from the same ledger;
- a gang gets all its nodes or none (R3);
- requests are taken in admission order; one that cannot start does not stop later ones
  that can (R2), and one that has waited past the bound (``reserve``) keeps later requests
  off the nodes closest to fitting it, so that it is not starved;
- a node quiet for what a request needs (train, serve, env) takes none of it (L2, L3, S6);
  a request for a container only goes to a node with a container runtime;
- a job is never placed on a node, nor given a card, that an infrastructure end of one of
  its attempts was laid to (H2: its ``excluded``).
"""

import heapq
from dataclasses import dataclass, field
from datetime import datetime

from . import waits as why
from .sharing import Book, Key
from .waits import Wait

# R16: what a member that names no CPUs or memory (and whose Fleet sets no default) is given
# when it holds no cards; with cards it gets their share of its node's budgets.
NO_CARD_CPUS = 1.0
NO_CARD_MEMORY = 2 << 30
# A gang's rendezvous port on its rank 0's node (R16): from the same ledger as served ports,
# so a replica is never placed on it and two gangs there never share one.
RENDEZVOUS_PORTS = range(29500, 30500)


@dataclass(frozen=True)
class Request:
    """What one member (or a gang's members) of a job, replica, session or episode needs."""

    key: tuple  # who asks, unique in a pass: ("trainingjob", 7), ("replica", 3, 0) …
    order: tuple  # admission order: (created_at, key)
    cards: int
    series: str = ""  # a hardware series' slug, or "" for any card
    nodes: int = 1  # a gang's size (R3)
    cpus: float | None = None
    memory: int | None = None
    port: int | None = None  # a served member's (S1): one per node
    quiet: str = "quiet_train"  # the node flag that keeps it off: quiet_train, _serve, _env
    container: bool = False  # it names an image: a node with a container runtime
    not_before: datetime | None = None  # a retry's backoff (R3)
    reserve: bool = False  # it has waited past TUNEPLANE_ALLOCATION_RESERVE_AFTER (R2)
    project: int = 0  # whose quota it counts against (Q1)
    priority: int = 0  # within its project, higher first (Q3)
    # H2: the nodes, and the cards as (node id, uuid), its earlier attempts failed on.
    excluded_nodes: frozenset = frozenset()
    excluded_cards: frozenset = frozenset()

    @property
    def total_cards(self) -> int:
        return self.cards * self.nodes

    @property
    def shape(self) -> tuple:
        """What decides where it fits: two requests of one shape fit the same nodes."""
        return (
            self.cards,
            self.series,
            self.nodes,
            self.cpus,
            self.memory,
            self.port,
            self.quiet,
            self.container,
            self.excluded_nodes,
            self.excluded_cards,
        )


@dataclass
class NodeCapacity:
    """What a placeable node has free now, as this pass sees it."""

    node_id: str
    address: str = ""
    free: dict[str, list[dict]] = field(default_factory=dict)  # series ("" any) → devices
    cpus: float | None = None  # what is left of its budget; None: no budget reported
    memory: int | None = None
    devices_by_series: dict[str, int] = field(default_factory=dict)  # every healthy card
    ports: set[int] = field(default_factory=set)  # served members' ports in use here (S1)
    quiet: frozenset = frozenset()  # its capabilities quiet now ("quiet_train", …)
    runtime: bool = False  # a container runtime
    budget_cpus: float | None = None  # its whole budgets, as its inventory reports them
    budget_memory: int | None = None
    # Its healthy cards, free or held, by index: their series ("" none): what a held card is
    # counted by, and what preemption frees.
    card_series: dict[int, str] = field(default_factory=dict)

    def free_of(self, series: str) -> list[dict]:
        return self.free.get(series, [])

    def free_for(self, request: Request) -> list[dict]:
        """Its free cards of the request's series, less those the request excludes (H2)."""
        free = self.free_of(request.series)
        if not request.excluded_cards:
            return free
        return [d for d in free if (self.node_id, d["uuid"]) not in request.excluded_cards]

    def given(self, request: Request) -> tuple[float | None, int | None]:
        """R16: the CPUs and memory a member of the request gets here — what it asked, else
        its cards' share of this node's budgets (cards asked ÷ cards on the node), else,
        holding no cards, 1 CPU and 2 GiB. None only where the node reports no budget."""
        cards_here = self.devices_by_series.get("", 0)

        def share(budget, no_card):
            if not request.cards:
                return no_card
            if budget is None or not cards_here:
                return None
            return budget * request.cards / cards_here

        cpus = request.cpus or share(self.budget_cpus, NO_CARD_CPUS)
        memory = request.memory or share(self.budget_memory, NO_CARD_MEMORY)
        return cpus, int(memory) if memory is not None else None

    def fits(self, request: Request) -> bool:
        cpus, memory = self.given(request)
        return (
            self.node_id not in request.excluded_nodes
            and len(self.free_for(request)) >= request.cards
            and (not cpus or self.cpus is None or self.cpus >= cpus - 1e-9)
            and (not memory or self.memory is None or self.memory >= memory)
            and (request.port is None or request.port not in self.ports)
            and request.quiet not in self.quiet
            and (self.runtime or not request.container)
        )

    def could_fit(self, request: Request) -> bool:
        """Once everything on it is cleaned up: whether reserving it for the request helps."""
        if self.node_id in request.excluded_nodes:
            return False
        return self.devices_by_series.get(request.series, 0) >= request.cards

    def take(self, request: Request) -> list[dict]:
        """The request's cards, from this node's free ones: no longer free to anyone, under
        any series they are listed by (an H100 is free as "h100" and as any card)."""
        taken = self.free_for(request)[: request.cards]
        for device in taken:
            for devices in self.free.values():
                if device in devices:
                    devices.remove(device)
        cpus, memory = self.given(request)
        if cpus and self.cpus is not None:
            self.cpus -= cpus
        if memory and self.memory is not None:
            self.memory -= memory
        if request.port is not None:
            self.ports.add(request.port)
        return [{"index": device["index"], "uuid": device["uuid"]} for device in taken]


@dataclass(frozen=True)
class Placement:
    """A request's members: for each rank, the node and the cards it holds there."""

    request: Request
    members: tuple[tuple[str, tuple[dict, ...]], ...]
    # Each member's CPUs and memory, as its node gives them (R16), in the order of members.
    given: tuple[tuple[float | None, int | None], ...] = ()
    rendezvous_port: int | None = None  # a gang's, on its rank 0's node
    quota_series: str = ""  # the series of the quota its cards count against (Q1)
    borrowed: bool = False  # placed beyond its project's guarantee (Q3)


def decide(
    requests,
    capacities,
    now: datetime,
    book: Book | None = None,
    waits: dict | None = None,
    unavailable: dict[str, int] | None = None,
) -> list[Placement]:
    """Which requests start now, and where. ``capacities`` (node id → NodeCapacity) is used
    up as requests are placed; pass copies to keep the originals. ``book``: the Fleet's
    quotas (Q1–Q3); without quotas requests are taken first come, first served. ``waits``,
    when given, is filled with why each request not placed waits (Q8; placement.waits),
    ``unavailable`` saying how many cards the Fleet has that no pass can use, and why."""
    ready = []
    for request in sorted(requests, key=lambda r: r.order):
        if request.not_before is not None and request.not_before > now:
            if waits is not None:
                waits[request.key] = why.backoff(request.not_before)
        else:
            ready.append(request)
    placing = _Pass(capacities)
    free_at_start = {
        series: sum(len(node.free_of(series)) for node in capacities.values())
        for series in {request.series for request in ready}
    }
    if book is None or not book.rows:
        for request in ready:
            placing.place(request)
    else:
        _shared(ready, placing, book)
    if waits is not None:
        placed = {placement.request.key for placement in placing.placed}
        shortfalls: dict = {}  # what the nodes lack, by request shape (Q8)
        for request in ready:
            if request.key in placed:
                continue
            waits[request.key] = placing.refused.get(request.key) or why.unfit(
                request,
                capacities,
                free_at_start[request.series],
                [
                    p
                    for p in placing.placed[: placing.tried_at.get(request.key, 0)]
                    if not request.series or p.request.series in ("", request.series)
                ],
                unavailable or {},
                shared=book is not None and bool(book.rows),
                shortfalls=shortfalls,
            )
        waits.update(why.positioned(waits, requests))
    return placing.placed


class _Pass:
    """What one pass has placed and reserved, and the shapes that fit nowhere any more
    (capacity only shrinks in a pass: a shape that failed fails again, without a look)."""

    def __init__(self, capacities):
        self.capacities = capacities
        self.placed: list[Placement] = []
        self.reserved: set[str] = set()
        self.full: set[tuple] = set()
        self.refused: dict[tuple, Wait] = {}  # not tried: over its limit, cards owed (Q8)
        self.tried_at: dict[tuple, int] = {}  # how many were placed before it was tried

    def place(self, request: Request, **quota) -> Placement | None:
        self.tried_at[request.key] = len(self.placed)
        chosen = (
            None
            if request.shape in self.full
            else best_fit(request, self.capacities, self.reserved)
        )
        port = free_rendezvous_port(chosen[0]) if chosen and request.nodes > 1 else None
        if chosen is None or (request.nodes > 1 and port is None):
            if chosen is None:
                self.full.add(request.shape)
            if request.reserve:
                _reserve(request, self.capacities, self.reserved)
            return None
        given = tuple(node.given(request) for node in chosen)
        if port is not None:
            chosen[0].ports.add(port)
        placement = Placement(
            request,
            tuple((node.node_id, tuple(node.take(request))) for node in chosen),
            given,
            port,
            **quota,
        )
        self.placed.append(placement)
        return placement


def _shared(ready: list[Request], placing: _Pass, book: Book) -> list[Placement]:
    """Q3: work within its project's guarantee first; then borrowed work, project by fair
    share, only on cards no project waits for within its guarantee and never past a
    project's limit. Within a project, priority then admission order; a request that cannot
    start never holds up the ones after it (R2)."""
    ready = sorted(ready, key=lambda r: (-r.priority, r.order))
    keys = {request.key: book.key(request.project, request.series) for request in ready}
    borrowing: dict[int, list[Request]] = {}
    owed: dict[Key, int] = {}  # cards guaranteed to a quota whose work waits for them
    for request in ready:
        key, cards = keys[request.key], request.total_cards
        if not book.within_guarantee(key, cards):
            borrowing.setdefault(request.project, []).append(request)
        elif placing.place(request, quota_series=key[1]):
            book.take(key, cards)
        else:
            owed[key] = owed.get(key, 0) + cards
    for key, cards in owed.items():
        owed[key] = min(cards, book.row(key).guaranteed - book.held.get(key, 0))
    idle = _Idle(placing.capacities, owed)
    turns = [
        (book.share(keys[queue[0].key]), queue[0].order, project)
        for project, queue in borrowing.items()
    ]
    heapq.heapify(turns)
    at = dict.fromkeys(borrowing, 0)
    while turns:
        _, _, project = heapq.heappop(turns)
        queue = borrowing[project]
        request = queue[at[project]]
        at[project] += 1
        key, cards = keys[request.key], request.total_cards
        row = book.row(key)
        if not book.within_limit(key, cards):
            held = book.held.get(key, 0)
            placing.refused[request.key] = why.over_limit(held, row.limit, cards, key[1])
        elif not idle.may_take(request):
            placing.refused[request.key] = why.owed(
                idle.free_to(request),
                idle.owed_to(request),
                cards,
                request.series,
            )
        else:
            before = idle.counts(placing.capacities)
            if placing.place(request, quota_series=key[1], borrowed=True):
                book.take(key, cards)
                idle.taken(before, placing.capacities)
        if at[project] < len(queue):
            following = queue[at[project]]
            heapq.heappush(turns, (book.share(keys[following.key]), following.order, project))
    return placing.placed


class _Idle:
    """Free cards a borrower may take: not those guaranteed to a quota whose work waits
    for them (Q3). Counted by series across the Fleet, as the quotas name them."""

    def __init__(self, capacities, owed: dict[Key, int]):
        self.owed: dict[str, int] = {}
        for (_, series), cards in owed.items():
            if cards > 0:
                self.owed[series] = self.owed.get(series, 0) + cards
        self.free = self.counts(capacities)

    def counts(self, capacities) -> dict[str, int]:
        if not self.owed:
            return {}
        return {
            series: sum(len(node.free_of(series)) for node in capacities.values())
            for series in self.owed
        }

    def taken(self, before: dict[str, int], capacities) -> None:
        after = self.counts(capacities)
        for series in self.free:
            self.free[series] -= before[series] - after[series]

    def free_to(self, request: Request) -> int:
        """The free cards counted that this request's cards would overlap (Q8: what its wait
        says is free): of its series, else of any card, else — a request of any card, the
        guarantees waiting all of some series — of every series counted."""
        if request.series in self.free:
            return self.free[request.series]
        if "" in self.free:
            return self.free[""]
        return sum(self.free.values())

    def owed_to(self, request: Request) -> int:
        """The cards owed to waiting guarantees that this request's cards would overlap."""
        return sum(
            owed
            for series, owed in self.owed.items()
            if not series or not request.series or series == request.series
        )

    def may_take(self, request: Request) -> bool:
        """Whether the cards each waiting guarantee is owed stay free once it takes its own:
        a borrower of any card or of the same series, or a guarantee of any card, shares
        the free cards counted."""
        for series, owed in self.owed.items():
            overlaps = not series or not request.series or series == request.series
            if overlaps and self.free[series] - request.total_cards < owed:
                return False
        return True


def free_rendezvous_port(node: NodeCapacity) -> int | None:
    return next((port for port in RENDEZVOUS_PORTS if port not in node.ports), None)


def best_fit(request: Request, capacities, reserved: set[str]) -> list[NodeCapacity] | None:
    """Best fit: the nodes with the fewest free cards that still fit, so that large holes
    stay for large requests. All of a gang's nodes, or none."""
    fitting = [
        node
        for node_id, node in capacities.items()
        if node_id not in reserved and node.fits(request)
    ]
    if len(fitting) < request.nodes:
        return None
    fitting.sort(key=lambda node: (len(node.free_of(request.series)), node.node_id))
    return fitting[: request.nodes]


def _reserve(request: Request, capacities, reserved: set[str]) -> None:
    """R2: a request waiting past the bound keeps later ones off the nodes closest to it."""
    closest = sorted(
        (
            node
            for node in capacities.values()
            if node.node_id not in reserved and node.could_fit(request)
        ),
        key=lambda node: (-len(node.free_of(request.series)), node.node_id),
    )
    reserved.update(node.node_id for node in closest[: request.nodes])
