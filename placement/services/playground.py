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

from audit.services import Actor
from nodes.models import NodeCommand
from tuneplane.errors import Conflict
from tuneplane.lifecycle import move

from ..choices import RUN_LIVE, SESSION_LIFECYCLE, DeploymentState
from ..models import PlaygroundSession
from .members import member_follow, members_clean, members_stop

SESSIONS = Actor.system("playground")


def session_ends_at(ttl_seconds: int):
    return timezone.now() + timedelta(seconds=ttl_seconds)


def _locked(session_id: int):
    session = PlaygroundSession.objects.select_for_update().get(pk=session_id)
    return session, list(session.members.select_for_update().order_by("pk"))


def session_member_reported(session_id: int, command: NodeCommand, before: dict) -> None:
    """A node's report moved a session's start command: its member follows
    (members.member_follow); what ended is cleaned up."""
    session, members = _locked(session_id)
    member = next(m for m in members if m.command_id == command.pk)
    member_follow(member, command, before, actor=SESSIONS, fleet_id=session.fleet_id)
    if (
        session.state == DeploymentState.LIVE
        and member.state not in RUN_LIVE
        and member.stop_requested_at is None
    ):
        # Its process ended on its own: the session ends saying why, never left live with
        # nothing serving it (a playground is short-lived; a new one is a new session).
        code = f" (exit code {member.exit_code})" if member.exit_code is not None else ""
        _end(session, members, SESSIONS, f"its process ended: {member.reason or 'exit'}{code}")
        return
    members_clean(members)


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
    move(
        session,
        SESSION_LIFECYCLE,
        DeploymentState.STOPPED,
        actor=actor,
        reason=reason[:200],
        action="playgroundsession.ended",
    )
    members_stop(members, now)
    members_clean(members, now)


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
