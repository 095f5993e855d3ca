"""Lifecycles as data: a record's allowed moves written once, and the one way to make one.

Each record with a lifecycle (a job, an attempt, a member, a revision, a playground session,
an episode, a node command) has its states as TextChoices and, beside them, a ``Lifecycle``:
the moves its states allow, drawn as a table. ``move`` checks a move against the table,
writes it and records its audit event in the caller's transaction (A1); a move the table does
not allow raises ``IllegalMove`` before anything is written. A writer that changes many
records in one statement (the allocator) checks each with ``Lifecycle.check`` and audits them
in one statement of its own.

A move to the state a record already has is no move: it is never checked against the table
(a reason or a readiness may still change, audited by its writer as what it is).
"""

from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from audit.services import Actor, audit_record

from .errors import Conflict


class IllegalMove(Conflict):
    """A move its record's lifecycle does not allow: a bug in the caller, refused whole."""

    code = "illegal_move"


@dataclass(frozen=True)
class Lifecycle:
    """The states of one record's ``field`` and, for each, the states it may move to."""

    name: str
    moves: Mapping[str, frozenset[str]]
    field: str = "state"

    @classmethod
    def of(cls, name: str, moves: Mapping[str, Iterable[str]], field: str = "state"):
        return cls(name, {str(old): frozenset(map(str, new)) for old, new in moves.items()}, field)

    def states(self) -> set[str]:
        return set(self.moves) | {new for targets in self.moves.values() for new in targets}

    def allows(self, old: str, new: str) -> bool:
        return new in self.moves.get(old, frozenset())

    def final(self, state: str) -> bool:
        return not self.moves.get(state)

    def check(self, old: str, new: str, target: object = "") -> None:
        """Raise ``IllegalMove`` for a move the table does not allow; note one it does."""
        if old == new:
            return
        if not self.allows(old, new):
            allowed = ", ".join(sorted(self.moves.get(old, ()))) or "nothing: it has ended"
            raise IllegalMove(
                f"{self.name} {target}: {old} → {new} is not a move its lifecycle allows "
                f"(from {old}: {allowed}).",
                lifecycle=self.name,
                state=old,
                to=new,
            )
        for made in _recording:
            made.add((self.name, old, new))

    def pairs(self) -> set[tuple[str, str]]:
        return {(old, new) for old, targets in self.moves.items() for new in targets}


# Sets the moves are noted in while a test records them (``recording``).
_recording: list[set] = []


@contextmanager
def recording():
    """Every move checked while inside, as ``(lifecycle name, old, new)``: for the test that
    proves each allowed move is made by some service."""
    made: set[tuple[str, str, str]] = set()
    _recording.append(made)
    try:
        yield made
    finally:
        _recording.remove(made)


def move(
    record,
    lifecycle: Lifecycle,
    to: str,
    *,
    actor: Actor,
    reason: str | None = None,
    action: str | None = None,
    fields: Mapping[str, object] | None = None,
    after: Mapping[str, object] | None = None,
    forced: bool = False,
) -> bool:
    """Move ``record`` to ``to`` (and ``reason``, and ``fields`` beside them), save those
    fields, and record one audit event: ``action`` (``<name>.<to>`` unless given), before and
    after (state and reason, and ``after``'s extras). Call inside the change's transaction.
    False, and nothing written, when the record is already there with that reason."""
    old = getattr(record, lifecycle.field)
    lifecycle.check(old, to, target=record.pk)
    before = {lifecycle.field: old}
    has_reason = hasattr(record, "reason")
    if has_reason:
        before["reason"] = record.reason
    if old == to and (reason is None or reason == record.reason) and not fields:
        return False
    setattr(record, lifecycle.field, to)
    if has_reason and reason is not None:
        record.reason = reason
    for name, value in (fields or {}).items():
        setattr(record, name, value)
    changed = [lifecycle.field, *(["reason"] if has_reason else []), *(fields or {})]
    record.save(update_fields=changed)
    shown = {lifecycle.field: to, **({"reason": record.reason} if has_reason else {})}
    audit_record(
        actor=actor,
        action=action or f"{lifecycle.name}.{to}",
        target=record,
        before=before,
        after={**shown, **(after or {})},
        forced=forced,
    )
    return True
