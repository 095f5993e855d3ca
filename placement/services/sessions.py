"""Playground sessions on node Fleets (S4): one served process, like a replica — placed by
the allocator with its cards and port, restarted and probed by the agent (S1) — for a
lifetime. At its end (``ends_at``), or when its owner ends it, it is stopped and cleaned up,
and its cards are released after the cleanup (R7).

Writers lock the session, then its members (after a node command, which a report has locked
first).
"""

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from audit.services import Actor, audit_record
from nodes.choices import CommandKind
from nodes.models import NodeCommand
from tuneplane.errors import Conflict

from ..choices import RUN_LIVE, DeploymentState
from ..models import Member, PlaygroundSession
from .runs import _send
from .serving import _grace, _replica_moved

SESSIONS = Actor.system("playground")


def session_ends_at(ttl_seconds: int):
    return timezone.now() + timedelta(seconds=ttl_seconds)


def _locked(session_id: int):
    session = PlaygroundSession.objects.select_for_update().get(pk=session_id)
    return session, list(session.members.select_for_update().order_by("pk"))


def session_command_observed(command: NodeCommand, before: dict) -> None:
    """A node's report moved a session's start command: its member follows; what ended is
    cleaned up (registered with nodes by placement.apps)."""
    if command.kind != CommandKind.START:
        return
    session_id = (
        Member.objects.filter(command=command, session__isnull=False)
        .values_list("session_id", flat=True)
        .first()
    )
    if session_id is None:
        return
    _, members = _locked(session_id)
    member = next(m for m in members if m.command_id == command.pk)
    _replica_moved(member, command, kind="session_member")
    _send(CommandKind.CLEANUP, [m for m in members if m.state not in RUN_LIVE], timezone.now())


def session_end(*, actor: Actor, session: PlaygroundSession, reason: str = "") -> PlaygroundSession:
    """S4: the session ends now — its process stopped (SIGTERM, SIGKILL after the grace)
    and cleaned up. A session that already ended is a conflict."""
    with transaction.atomic():
        session, members = _locked(session.pk)
        if session.state != DeploymentState.LIVE:
            raise Conflict(f"The session has already ended: {session.reason}.", code="ended")
        _end(session, members, actor, reason or f"ended by {actor}")
    return session


def _end(session, members, actor: Actor, reason: str) -> None:
    now = timezone.now()
    before = {"state": session.state, "reason": session.reason}
    session.state, session.reason = DeploymentState.STOPPED, reason[:200]
    session.save(update_fields=["state", "reason"])
    audit_record(
        actor=actor,
        action="playgroundsession.ended",
        target=session,
        before=before,
        after={"state": session.state, "reason": session.reason},
    )
    _send(
        CommandKind.STOP, [m for m in members if m.state in RUN_LIVE], now, grace_seconds=_grace()
    )
    _send(CommandKind.CLEANUP, [m for m in members if m.state not in RUN_LIVE], now)


def sessions_expire(*, now=None) -> dict[str, int]:
    """The beat's pass: every live session past its lifetime ends (S4), each in a
    transaction of its own."""
    now = now or timezone.now()
    due = PlaygroundSession.objects.filter(state=DeploymentState.LIVE, ends_at__lt=now)
    ended = 0
    for session_id in list(due.values_list("pk", flat=True)):
        with transaction.atomic():
            session, members = _locked(session_id)
            if session.state == DeploymentState.LIVE and session.ends_at < now:
                _end(session, members, SESSIONS, "its lifetime ended (ttl_seconds, rule S4)")
                ended += 1
    return {"ended": ended}
