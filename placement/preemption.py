"""Which running jobs a waiting request may preempt (Q4, Q5), as pure functions of plain
data, like placement.decide. The allocator (placement.services.preempting) calls ``plan``
with what its pass left waiting, and stops the victims it answers (Q6).

- Q4: work on borrowed cards is always preemptible; work within its project's guarantee only
  if it says so (``preemptible``).
- Q5: a request preempts when it waits within its project's guarantee (victims: other
  projects' borrowed work), or when a higher-priority job of its own project waits
  (victims: its project's lower-priority work that may be preempted). Only if the whole
  request, a gang included, then fits; the fewest and cheapest victims (borrowed first, then
  lowest priority, then least run since its last checkpoint — H4 — which without one is the
  youngest); never a job that has run less than the minimum runtime.
  Replicas, sessions and episodes are never victims (a deployment never drops below its
  replica count). No oscillation, by construction: another project's work is taken only for
  a request within its guarantee, so the preemptor borrows nothing afterwards (its share
  above its guarantee is 0, never above the victim's), and a victim on borrowed cards never
  preempts work within a guarantee back.
- A pass preempts for each waiting request in turn (priority, then admission order); what
  one preemptor is to take — the victims and the free cards it needs beside theirs — is no
  longer there for the next, and its cards count against its quota from then on.
"""

import dataclasses
from dataclasses import dataclass
from datetime import datetime

from .decide import NodeCapacity, Request, best_fit, free_rendezvous_port
from .sharing import Book, Key


@dataclass(frozen=True)
class Running:
    """A running job as preemption weighs it: whose, against which quota, on what terms, and
    its members' nodes, cards (each with its series) and CPUs and memory."""

    key: tuple
    project: int
    quota: Key
    borrowed: bool
    preemptible: bool
    priority: int
    started_at: datetime
    members: tuple[tuple[str, tuple[dict, ...]], ...]  # (node, cards with "series")
    given: tuple[tuple[float | None, int | None], ...] = ()
    attempt: int = 0  # its attempt's id, for the writer that stops it
    # H4: when it last marked a checkpoint (None: never): what a preemption loses is only
    # what it ran since.
    checkpointed_at: datetime | None = None

    @property
    def kept_until(self) -> datetime:
        """Its work is kept up to here: its last checkpoint in this attempt, else its start."""
        if self.checkpointed_at is not None and self.checkpointed_at > self.started_at:
            return self.checkpointed_at
        return self.started_at

    @property
    def cards(self) -> int:
        return sum(len(cards) for _, cards in self.members)

    @property
    def may_be_preempted(self) -> bool:
        return self.borrowed or self.preemptible  # Q4


def plan(
    waiting: list[Request],
    running: list[Running],
    capacities: dict[str, NodeCapacity],
    book: Book,
    now: datetime,
    min_runtime: float,
) -> list[tuple[Request, list[Running]]]:
    """Q5 for one pass: each request of ``waiting`` that preemption makes fit, with its
    victims. ``capacities`` and ``book`` are used up as ``decide`` uses them: pass copies
    to keep the originals."""
    pool = list(running)
    chosen: list[tuple[Request, list[Running]]] = []
    may = _Candidates(pool, now, min_runtime)
    fitting: dict[tuple, dict[str, NodeCapacity]] = {}  # by shape, until capacity changes
    for waiter in sorted(waiting, key=lambda r: (-r.priority, r.order)):
        if not may.preempt_for(waiter, book):
            continue
        if waiter.shape not in fitting:
            fitting[waiter.shape] = _fitting(waiter, capacities)
        taken = victims(waiter, pool, capacities, book, now, min_runtime, fitting[waiter.shape])
        if not taken:  # None: nothing it may take makes it fit; []: it fits already
            continue
        fitting.clear()
        chosen.append((waiter, taken))
        pool = [job for job in pool if job not in taken]
        capacities.update(_freed(capacities, taken))
        nodes = best_fit(waiter, capacities, set())
        if waiter.nodes > 1:
            nodes[0].ports.add(free_rendezvous_port(nodes[0]))
        for node in nodes:
            node.take(waiter)
        for job in taken:
            book.held[job.quota] = book.held.get(job.quota, 0) - job.cards
        book.take(book.key(waiter.project, waiter.series), waiter.total_cards)
    return chosen


class _Candidates:
    """What the running jobs offer, read once a pass, so that a request with no candidate
    victim is passed over without a look at the nodes (a pass may leave thousands waiting):
    each project's lowest priority among its jobs that may be preempted, and the projects
    that run on borrowed cards. A request passed here may still find no set that fits."""

    def __init__(self, running: list[Running], now: datetime, min_runtime: float):
        self.lowest: dict[int, int] = {}
        self.lending: set[int] = set()  # projects running borrowed jobs old enough
        for job in running:
            if (now - job.started_at).total_seconds() < min_runtime or not job.may_be_preempted:
                continue
            self.lowest[job.project] = min(job.priority, self.lowest.get(job.project, job.priority))
            if job.borrowed:
                self.lending.add(job.project)

    def preempt_for(self, waiter: Request, book: Book) -> bool:
        if waiter.priority > self.lowest.get(waiter.project, waiter.priority):
            return True
        others = self.lending - {waiter.project}
        key = book.key(waiter.project, waiter.series)
        return bool(others) and book.within_guarantee(key, waiter.total_cards)


def victims(
    waiter: Request,
    running: list[Running],
    capacities: dict[str, NodeCapacity],
    book: Book,
    now: datetime,
    min_runtime: float,
    fitting: dict[str, NodeCapacity] | None = None,
) -> list[Running] | None:
    """Q5: the running jobs to preempt so that ``waiter`` fits, fewest and cheapest; None when
    no set of the jobs it may preempt makes it fit. ``fitting``: the nodes it fits on now,
    when the caller has them (``_fitting``)."""
    if fitting is None:
        fitting = _fitting(waiter, capacities)
    if _fits(waiter, capacities, [], fitting):
        return []
    key = book.key(waiter.project, waiter.series)
    reclaiming = book.within_guarantee(key, waiter.total_cards)
    candidates = [
        job
        for job in running
        if (now - job.started_at).total_seconds() >= min_runtime
        and job.may_be_preempted
        and (
            (reclaiming and job.borrowed and job.project != waiter.project)
            or (job.project == waiter.project and job.priority < waiter.priority)
        )
    ]
    # Borrowed first, then lowest priority, then least work lost: least run since its last
    # checkpoint (H4), which for a job without one is the youngest.
    candidates.sort(key=lambda job: (not job.borrowed, job.priority, -job.kept_until.timestamp()))
    chosen: list[Running] = []
    for job in candidates:
        chosen.append(job)
        if _fits(waiter, capacities, chosen, fitting) and _within_limit(waiter, key, book, chosen):
            break
    else:
        return None
    for job in list(reversed(chosen[:-1])):  # the fewest: drop any the request fits without
        fewer = [other for other in chosen if other is not job]
        if _fits(waiter, capacities, fewer, fitting) and _within_limit(waiter, key, book, fewer):
            chosen = fewer
    return chosen


def _within_limit(waiter: Request, key: Key, book: Book, freed: list[Running]) -> bool:
    """The preemptor stays within its limit once the victims of its own quota are gone
    (a higher-priority job taking its project's own lower-priority work's cards)."""
    returned = sum(job.cards for job in freed if job.quota == key)
    return book.within_limit(key, waiter.total_cards - returned)


def _freed(capacities: dict[str, NodeCapacity], freed: list[Running]) -> dict:
    """The nodes the victims run on, copied, with their cards, CPUs and memory free."""
    touched = {node_id for job in freed for node_id, _ in job.members}
    trial = {node_id: _copied(capacities[node_id]) for node_id in touched if node_id in capacities}
    for job in freed:
        for rank, (node_id, cards) in enumerate(job.members):
            node = trial.get(node_id)
            if node is None:
                continue
            for card in cards:
                device = {k: v for k, v in card.items() if k != "series"}
                node.free.setdefault("", []).append(device)
                if card.get("series"):
                    node.free.setdefault(card["series"], []).append(device)
            cpus, memory = job.given[rank] if rank < len(job.given) else (None, None)
            if cpus and node.cpus is not None:
                node.cpus += cpus
            if memory and node.memory is not None:
                node.memory += memory
    return trial


def _copied(node: NodeCapacity) -> NodeCapacity:
    """A node to try victims on: what taking and freeing change is its own."""
    return dataclasses.replace(
        node,
        free={series: list(devices) for series, devices in node.free.items()},
        ports=set(node.ports),
    )


def _fitting(waiter: Request, capacities: dict[str, NodeCapacity]) -> dict[str, NodeCapacity]:
    return {node_id: node for node_id, node in capacities.items() if node.fits(waiter)}


def _fits(
    waiter: Request,
    capacities: dict[str, NodeCapacity],
    freed: list[Running],
    fitting: dict[str, NodeCapacity],
) -> bool:
    """Whether the whole request, a gang with its rendezvous port included, fits once the
    ``freed`` jobs' members are gone: on the nodes they free, and on those it ``fitting``
    already (a node no victim runs on fits it or not whatever is preempted)."""
    trial = _freed(capacities, freed)
    nodes = {node_id: node for node_id, node in fitting.items() if node_id not in trial}
    chosen = best_fit(waiter, {**nodes, **trial}, set())
    if chosen is None:
        return False
    return waiter.nodes == 1 or free_rendezvous_port(chosen[0]) is not None
