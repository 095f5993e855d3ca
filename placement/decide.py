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
  a request for a container only goes to a node with a container runtime.
"""

from dataclasses import dataclass, field
from datetime import datetime

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

    def free_of(self, series: str) -> list[dict]:
        return self.free.get(series, [])

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
            len(self.free_of(request.series)) >= request.cards
            and (not cpus or self.cpus is None or self.cpus >= cpus - 1e-9)
            and (not memory or self.memory is None or self.memory >= memory)
            and (request.port is None or request.port not in self.ports)
            and request.quiet not in self.quiet
            and (self.runtime or not request.container)
        )

    def could_fit(self, request: Request) -> bool:
        """Once everything on it is cleaned up: whether reserving it for the request helps."""
        return self.devices_by_series.get(request.series, 0) >= request.cards

    def take(self, request: Request) -> list[dict]:
        """The request's cards, from this node's free ones: no longer free to anyone, under
        any series they are listed by (an H100 is free as "h100" and as any card)."""
        taken = self.free_of(request.series)[: request.cards]
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


def decide(requests, capacities, now: datetime) -> list[Placement]:
    """Which requests start now, and where. ``capacities`` (node id → NodeCapacity) is used
    up as requests are placed; pass copies to keep the originals."""
    placed = []
    reserved: set[str] = set()
    for request in sorted(requests, key=lambda r: r.order):
        if request.not_before is not None and request.not_before > now:
            continue
        chosen = _pick(request, capacities, reserved)
        port = _rendezvous_port(chosen[0]) if chosen and request.nodes > 1 else None
        if chosen is None or (request.nodes > 1 and port is None):
            if request.reserve:
                _reserve(request, capacities, reserved)
            continue
        given = tuple(node.given(request) for node in chosen)
        if port is not None:
            chosen[0].ports.add(port)
        placed.append(
            Placement(
                request,
                tuple((node.node_id, tuple(node.take(request))) for node in chosen),
                given,
                port,
            )
        )
    return placed


def _rendezvous_port(node: NodeCapacity) -> int | None:
    return next((port for port in RENDEZVOUS_PORTS if port not in node.ports), None)


def _pick(request: Request, capacities, reserved: set[str]) -> list[NodeCapacity] | None:
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
