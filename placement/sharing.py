"""Sharing a node Fleet between projects (Q1–Q3), as pure functions of plain data: which
quota a request counts against, whether it is within its project's guarantee or limit, and
each project's fair share. placement.decide orders and admits requests by them; the
allocator reads the rows and brings each project's use forward (placement.services.quotas).

- A quota is a project's, on a Fleet, for one hardware series or for any card (""): the
  cards it is guaranteed, the most it may hold (None: unlimited), its weight. A request
  counts against its project's quota for its series, else its quota for any card; a project
  with no quota has guaranteed 0, no limit, weight 1 (``DEFAULT``).
- A project's fair share is what it holds and has held, per weight: the cards it holds now
  (those placed in this pass included, so that a hundred jobs submitted at once do not all
  slip in before its use moves) plus its decayed use in card-seconds divided by the decay's
  time constant (so both are in cards: its recent average), divided by its weight. Lower
  goes first.
- What a quota borrows is what it holds above its guarantee now (``borrowed``): the one
  number the quotas' API, the admin's Fleet page and the ``tuneplane_quota_borrowed`` gauge
  report. Which running work is on borrowed cards — what preemption may take (Q4, Q5) — is
  each member's, decided when it was placed (``Member.borrowed``), and not this number.
"""

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class QuotaRow:
    guaranteed: int = 0
    limit: int | None = None  # None: unlimited
    weight: int = 1


DEFAULT = QuotaRow()
Key = tuple[int, str]  # (project id, series; "" any card)


def time_constant(half_life_seconds: float) -> float:
    """The decay's time constant τ: use decays as e^(-t/τ), halving every half-life."""
    return half_life_seconds / math.log(2)


def borrowed(held: int, guaranteed: int) -> int:
    """Q3: the cards a quota borrows now: what it holds above its guarantee, never below 0."""
    return max(0, held - guaranteed)


def brought_forward(card_seconds: float, cards_held: int, elapsed: float, tau: float) -> float:
    """Decayed use ``elapsed`` seconds on, the project having held ``cards_held`` cards all
    that while: the old use decays, the new is added as it too decays."""
    if elapsed <= 0:
        return card_seconds
    kept = math.exp(-elapsed / tau)
    return card_seconds * kept + cards_held * tau * (1 - kept)


@dataclass
class Book:
    """One pass's ledger of a Fleet's quotas: its rows, the cards each quota holds (moved
    as the pass places), and each project's decayed use."""

    rows: dict[Key, QuotaRow]
    held: dict[Key, int] = field(default_factory=dict)
    usage: dict[int, float] = field(default_factory=dict)  # project → decayed card-seconds
    tau: float = time_constant(7 * 86400)

    def key(self, project: int, series: str) -> Key:
        """The quota a request of ``project`` for ``series`` counts against."""
        if series and (project, series) in self.rows:
            return (project, series)
        return (project, "")

    def row(self, key: Key) -> QuotaRow:
        return self.rows.get(key, DEFAULT)

    def within_guarantee(self, key: Key, cards: int) -> bool:
        return self.held.get(key, 0) + cards <= self.row(key).guaranteed

    def within_limit(self, key: Key, cards: int) -> bool:
        limit = self.row(key).limit
        return limit is None or self.held.get(key, 0) + cards <= limit

    def borrowed(self, key: Key) -> int:
        """The cards quota ``key`` borrows now (``borrowed``); a project without a quota row
        is guaranteed 0, so all it holds is borrowed."""
        return borrowed(self.held.get(key, 0), self.row(key).guaranteed)

    def project_held(self, project: int) -> int:
        return sum(cards for (owner, _), cards in self.held.items() if owner == project)

    def share(self, key: Key) -> float:
        """Q3: the project's fair share, as its quota ``key`` weighs it; lower goes first."""
        project = key[0]
        used = self.project_held(project) + self.usage.get(project, 0.0) / self.tau
        return used / self.row(key).weight

    def take(self, key: Key, cards: int) -> None:
        self.held[key] = self.held.get(key, 0) + cards
