from dataclasses import dataclass, field

from django.contrib.auth.models import AbstractBaseUser
from django.db import models, transaction
from django.utils import timezone
from prometheus_client import Counter

from tuneplane import bulk_insert, correlation

from .choices import ActorType
from .models import AuditEvent


@dataclass(frozen=True)
class Actor:
    """Who made a change: a user, a node, or the system itself (a sweep, a migration). Made at
    the edge (a view, the admin, the gateway, a task) and handed to every service; a user's
    carries the user, whose visibility a submission is judged by."""

    type: str
    id: str = ""
    label: str = ""
    user: AbstractBaseUser | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of_user(cls, user: AbstractBaseUser) -> "Actor":
        return cls(ActorType.USER, str(user.pk), user.get_username(), user)

    @classmethod
    def of_node(cls, node_id: str) -> "Actor":
        return cls(ActorType.NODE, node_id, node_id)

    @classmethod
    def system(cls, name: str) -> "Actor":
        return cls(ActorType.SYSTEM, "", name)


def _checked(actor: Actor) -> Actor:
    if not isinstance(actor, Actor):
        raise TypeError(
            f"an audit actor is an Actor, not {type(actor).__name__}: make one at "
            "the edge (Actor.of_user, Actor.of_node, Actor.system)"
        )
    return actor


def _require_transaction(action: str) -> None:
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError(f"audit of {action!r} must run inside the change's transaction")


AUDIT_EVENTS = Counter(
    "tuneplane_audit_events", "Audit events written (committed), by action.", ["action"]
)


def _count_on_commit(counts: dict[str, int]) -> None:
    def count():
        for action, n in counts.items():
            AUDIT_EVENTS.labels(action).inc(n)

    transaction.on_commit(count)


def audit_record(
    *,
    actor: Actor,
    action: str,
    target: "models.Model | tuple[str, str]",
    before: dict | None = None,
    after: dict | None = None,
    forced: bool = False,
) -> AuditEvent:
    """Record one change. Call it inside the transaction that makes the change (A1).

    ``target`` is the changed object, or ``(type, id)`` for something that has no
    row — a refused join names the token it was offered by what it knows of it.
    """
    _require_transaction(action)
    actor = _checked(actor)
    if isinstance(target, tuple):
        target_type, target_id = target
    else:
        target_type, target_id = target._meta.label_lower, str(target.pk)
    _count_on_commit({action: 1})
    return AuditEvent.objects.create(
        at=timezone.now(),
        actor_type=actor.type,
        actor_id=actor.id,
        actor_label=actor.label,
        action=action,
        target_type=target_type,
        target_id=target_id,
        before=before,
        after=after,
        forced=forced,
        correlation_id=correlation.current(),
    )


def audit_record_many(
    *,
    actor: Actor,
    action: str,
    target_type: str,
    changes: list[tuple[str, dict | None, dict | None]],
) -> int:
    """One event per changed object — ``(target id, before, after)`` — in one statement, for a
    set-based change such as a sweep: the statements do not grow with the objects."""
    return audit_record_each(
        actor=actor,
        target_type=target_type,
        events=[(action, target_id, before, after) for target_id, before, after in changes],
    )


def audit_record_each(
    *, actor: Actor, target_type: str, events: list[tuple[str, str, dict | None, dict | None]]
) -> int:
    """One event per ``(action, target id, before, after)``, of several actions, in one
    statement: for a sweep whose one statement made changes of several kinds."""
    return audit_record_by_each(
        target_type=target_type, events=[(actor, *event) for event in events]
    )


def audit_record_by_each(
    *, target_type: str, events: list[tuple[Actor, str, str, dict | None, dict | None]]
) -> int:
    """One event per ``(actor, action, target id, before, after)``, each by its own actor, in
    one statement (``bulk_insert``: a COPY on PostgreSQL, INSERTs of 5,000 on SQLite): for a
    batch of changes made by many (the Hellos of many nodes)."""
    for actor, *_ in events:
        _checked(actor)
    for action in {action for _, action, *_ in events}:
        _require_transaction(action)
    now = timezone.now()
    correlation_id = correlation.current()
    counts: dict[str, int] = {}
    for _, action, *_ in events:
        counts[action] = counts.get(action, 0) + 1
    _count_on_commit(counts)
    bulk_insert.insert(
        [
            AuditEvent(
                at=now,
                actor_type=actor.type,
                actor_id=actor.id,
                actor_label=actor.label,
                action=action,
                target_type=target_type,
                target_id=str(target_id),
                before=before,
                after=after,
                correlation_id=correlation_id,
            )
            for actor, action, target_id, before, after in events
        ]
    )
    return len(events)
