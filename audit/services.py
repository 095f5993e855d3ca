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


def audit_record(
    *,
    actor: "Actor | AbstractBaseUser",
    action: str,
    target: models.Model,
    before: dict | None = None,
    after: dict | None = None,
    forced: bool = False,
) -> AuditEvent:
    """Record one change. Call it inside the transaction that makes the change (A1)."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError(f"audit_record({action!r}) must run inside the change's transaction")
    actor = as_actor(actor)
    return AuditEvent.objects.create(
        at=timezone.now(),
        actor_type=actor.type,
        actor_id=actor.id,
        actor_label=actor.label,
        action=action,
        target_type=target._meta.label_lower,
        target_id=str(target.pk),
        before=before,
        after=after,
        forced=forced,
        correlation_id=correlation.current(),
    )
