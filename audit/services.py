from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.db import models, transaction
from django.utils import timezone

from tuneplane import correlation

from .choices import ActorType
from .models import AuditEvent


@dataclass(frozen=True)
class Actor:
    """Who made a change: a user, a node, or the system itself (a sweep, a migration)."""

    type: str
    id: str = ""
    label: str = ""

    @classmethod
    def of_user(cls, user: AbstractBaseUser) -> "Actor":
        return cls(ActorType.USER, str(user.pk), user.get_username())

    @classmethod
    def of_node(cls, node_id: str) -> "Actor":
        return cls(ActorType.NODE, node_id, node_id)

    @classmethod
    def system(cls, name: str) -> "Actor":
        return cls(ActorType.SYSTEM, "", name)


def as_actor(actor: "Actor | AbstractBaseUser") -> Actor:
    return actor if isinstance(actor, Actor) else Actor.of_user(actor)


def _require_transaction(action: str) -> None:
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError(f"audit of {action!r} must run inside the change's transaction")


def audit_record(
    *,
    actor: "Actor | AbstractBaseUser",
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
    actor = as_actor(actor)
    if isinstance(target, tuple):
        target_type, target_id = target
    else:
        target_type, target_id = target._meta.label_lower, str(target.pk)
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


def audit_record_many(*, actor: "Actor | AbstractBaseUser", action: str, target_type: str,
                      changes: list[tuple[str, dict | None, dict | None]]) -> int:
    """One event per changed object — ``(target id, before, after)`` — in one INSERT, for a
    set-based change such as a sweep: the statements do not grow with the objects."""
    _require_transaction(action)
    actor = as_actor(actor)
    now = timezone.now()
    correlation_id = correlation.current()
    AuditEvent.objects.bulk_create([
        AuditEvent(at=now, actor_type=actor.type, actor_id=actor.id, actor_label=actor.label,
                   action=action, target_type=target_type, target_id=str(target_id),
                   before=before, after=after, correlation_id=correlation_id)
        for target_id, before, after in changes], batch_size=5000)
    return len(changes)
