"""F7: the one guard a Fleet deletion passes, and what outlives the Fleet.

Higher apps (nodes, placement) register what blocks a deletion, so that this
app never imports them. A blocker returns a sentence for each thing that
blocks — "3 nodes (n-1, n-2, n-3)" — or nothing.

They also register what they let go of when a deletion goes ahead: records kept
for the audit log that would otherwise point at a Fleet that no longer exists
(a removed node). A release runs inside the deletion's transaction, once nothing
blocks it, audits what it changes, and returns what it let go of, which the
Fleet's deletion event keeps: ``{"nodes_detached": ["n-1"]}``, or nothing.
"""

from collections.abc import Callable, Iterable

Blocker = Callable[["Fleet"], Iterable[str]]  # noqa: F821 - the model, by name only
Release = Callable[..., dict]  # called as release(actor=..., fleet=...)

_blockers: list[Blocker] = []
_releases: list[Release] = []


def register_deletion_blocker(blocker: Blocker) -> Blocker:
    if blocker not in _blockers:
        _blockers.append(blocker)
    return blocker


def unregister_deletion_blocker(blocker: Blocker) -> None:
    _blockers.remove(blocker)


def deletion_blockers(fleet) -> list[str]:
    return [reason for blocker in _blockers for reason in blocker(fleet)]


def register_deletion_release(release: Release) -> Release:
    if release not in _releases:
        _releases.append(release)
    return release


def deletion_releases(*, actor, fleet) -> dict:
    released: dict = {}
    for release in _releases:
        released.update(release(actor=actor, fleet=fleet))
    return released
