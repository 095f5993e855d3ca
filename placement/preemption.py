"""Which running jobs a waiting request may preempt (Q4, Q5), as a pure function of plain
data, like placement.decide. Not yet called by the allocator: the victims' stop, the
``preempting`` state and the requeue (Q6) are the next step.

- Q4: work on borrowed cards is always preemptible; work within its project's guarantee only
  if it says so (``preemptible``).
- Q5: a request preempts when it waits within its project's guarantee (victims: other
  projects' borrowed work), or when a higher-priority job of its own project waits
  (victims: its project's lower-priority work that may be preempted). Only if the whole
  request, a gang included, then fits; the fewest and cheapest victims (borrowed first, then
  lowest priority, then youngest); never a job that has run less than the minimum runtime.
  Replicas, sessions and episodes are never victims (a deployment never drops below its
  replica count). No oscillation, by construction: another project's work is taken only for
  a request within its guarantee, so the preemptor borrows nothing afterwards (its share
  above its guarantee is 0, never above the victim's), and a victim on borrowed cards never
  preempts work within a guarantee back.
"""

import copy
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

    @property
    def cards(self) -> int:
        return sum(len(cards) for _, cards in self.members)

    @property
    def may_be_preempted(self) -> bool:
        return self.borrowed or self.preemptible  # Q4


def victims(
    waiter: Request,
    running: list[Running],
    capacities: dict[str, NodeCapacity],
    book: Book,
    now: datetime,
    min_runtime: float,
) -> list[Running] | None:
    """Q5: the running jobs to preempt so that ``waiter`` fits, fewest and cheapest; None when
    no set of the jobs it may preempt makes it fit."""
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
    candidates.sort(key=lambda job: (not job.borrowed, job.priority, -job.started_at.timestamp()))
    chosen: list[Running] = []
    for job in candidates:
        chosen.append(job)
        if _fits(waiter, capacities, chosen):
            break
    else:
        return None
    for job in list(reversed(chosen[:-1])):  # the fewest: drop any the request fits without
        fewer = [other for other in chosen if other is not job]
        if _fits(waiter, capacities, fewer):
            chosen = fewer
    return chosen


def _fits(waiter: Request, capacities: dict[str, NodeCapacity], freed: list[Running]) -> bool:
    touched = {node_id for job in freed for node_id, _ in job.members}
    trial = {
        node_id: copy.deepcopy(node) if node_id in touched else node
        for node_id, node in capacities.items()
    }
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
    chosen = best_fit(waiter, trial, set())
    if chosen is None:
        return False
    return waiter.nodes == 1 or free_rendezvous_port(chosen[0]) is not None
