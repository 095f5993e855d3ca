"""F7: the one guard a Fleet deletion passes.

Higher apps (nodes, placement) register what blocks a deletion, so that this
app never imports them. A blocker returns a sentence for each thing that
blocks — "3 nodes (n-1, n-2, n-3)" — or nothing.
"""

from collections.abc import Callable, Iterable

Blocker = Callable[["Fleet"], Iterable[str]]  # noqa: F821 - the model, by name only

_blockers: list[Blocker] = []


def register_deletion_blocker(blocker: Blocker) -> Blocker:
    if blocker not in _blockers:
        _blockers.append(blocker)
    return blocker


def unregister_deletion_blocker(blocker: Blocker) -> None:
    _blockers.remove(blocker)


def deletion_blockers(fleet) -> list[str]:
    return [reason for blocker in _blockers for reason in blocker(fleet)]
