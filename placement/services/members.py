"""A member as its node reports it, whatever owns it, and what every owner does with its members.

A member is one process (or container) on one node holding specific cards: a rank of a job's
attempt, a replica of a revision, a playground session's process or an episode's. Its node
reports it as the state of its start command; ``reported_as`` is the one mapping from that
report to the member's move (``MEMBER_LIFECYCLE``), and ``member_follow`` makes the move,
audited, for every kind of owner. The owner then settles through its own lifecycle
(runs, serving, sessions, episodes), and every owner stops and cleans up its members once
(``members_send``) and has their cards released when the node confirms the cleanup
(``member_release``, R7).

The mapping, for a member still live (``starting``, ``running``, ``unknown``)::

    command running                        → running (its reason: unkillable, restarting …)
    command lost, reason "abandoned"       → abandoned  (its node was removed by force, D3)
    command lost, reason "lost"            → lost       (given up past the deadline, R8)
    command lost, any other reason         → failed, "vanished" (its node did not know it, R8)
    command ended, "stopped" (or no reason
      after the console asked it to stop)  → cancelled, "stopped"
    command succeeded                      → succeeded, its reason
    command failed                         → failed, its reason ("oom", "exit" …)

A member that has ended moves no more: a node that still runs a given-up member says so, and
that is recorded (R9) while the cleanup sent when it was given up stops it.
"""

from django.conf import settings
from django.utils import timezone

from audit.services import Actor, audit_record
from nodes.choices import CommandKind, CommandState
from nodes.models import NodeCommand
from nodes.services.commands import node_commands_create_many
from tuneplane.lifecycle import move

from ..choices import MEMBER_LIFECYCLE, RUN_LIVE, Cleanup, RunState
from ..models import CardHold, Member
from .passes import allocate_on_commit
from .waiting import member_kind

RUNS = Actor.system("runs")
_ENDED_AS = {CommandState.SUCCEEDED: RunState.SUCCEEDED, CommandState.FAILED: RunState.FAILED}


def reported_as(
    state: str, *, command_state: str, command_reason: str = "", stop_requested: bool = False
) -> tuple[str, str] | None:
    """The state and reason a member in ``state`` takes from its start command's report, or
    None when the report moves nothing (the member has ended, or the command is pending)."""
    if state not in RUN_LIVE:
        return None
    if command_state == CommandState.RUNNING:
        return RunState.RUNNING, command_reason
    if command_state == CommandState.LOST:
        if command_reason == "abandoned":
            return RunState.ABANDONED, "abandoned"
        if command_reason == "lost":
            return RunState.LOST, "lost"
        return RunState.FAILED, "vanished"
    if command_state in _ENDED_AS:
        if command_reason == "stopped" or (stop_requested and not command_reason):
            return RunState.CANCELLED, "stopped"
        return _ENDED_AS[command_state], command_reason or "vanished"
    return None


def member_follow(
    member: Member, command: NodeCommand, before_command: dict, *, actor: Actor, fleet_id
) -> None:
    """The member (locked by its owner's writer) as its start command now says: its move,
    its readiness and restarts if it serves, its confinement, each change audited; its cards
    released once its node confirms the cleanup. ``fleet_id`` is called only then."""
    now = timezone.now()
    kind = member_kind(member)
    moved = reported_as(
        member.state,
        command_state=command.state,
        command_reason=command.reason,
        stop_requested=member.stop_requested_at is not None,
    )
    fields: dict = {}
    if command.confinement and command.confinement != member.confinement:
        fields["confinement"] = command.confinement
    if command.checkpointed_at and command.checkpointed_at != member.checkpointed_at:
        fields["checkpointed_at"] = command.checkpointed_at  # H4
    if moved is not None and moved[0] == RunState.RUNNING:
        fields.update(
            started_at=member.started_at or now,
            ready=command.ready,
            restarts=command.restarts,
            detail=command.detail,
        )
    elif moved is not None:
        fields.update(exit_code=command.exit_code, ended_at=now, ready=False)
    if (
        command.state == CommandState.RUNNING
        and member.state not in RUN_LIVE
        and before_command.get("state") != CommandState.RUNNING
    ):
        # R9: a given-up member still running on a node that came back. It never counts
        # again; the cleanup sent when it was given up stops it.
        audit_record(
            actor=actor,
            action=f"{kind}.leftover_running",
            target=member,
            before={"state": member.state},
            after={"state": member.state, "node_reports": "running"},
        )
    changed = {name: value for name, value in fields.items() if getattr(member, name) != value}
    if moved is not None and (moved[0], moved[1]) != (member.state, member.reason):
        action = None
        if moved[0] == member.state and changed.get("ready", member.ready) != member.ready:
            action = f"{kind}.ready" if changed["ready"] else f"{kind}.not_ready"
        move(
            member,
            MEMBER_LIFECYCLE,
            moved[0],
            actor=actor,
            reason=moved[1][:64],
            action=action or f"{kind}.{moved[0]}",
            fields=changed,
            after={"ready": changed.get("ready", member.ready)} if member.port else None,
        )
    elif changed:
        was_ready = member.ready
        for name, value in changed.items():
            setattr(member, name, value)
        member.save(update_fields=list(changed))
        if member.ready != was_ready:
            audit_record(
                actor=actor,
                action=f"{kind}.ready" if member.ready else f"{kind}.not_ready",
                target=member,
                before={"state": member.state, "reason": member.reason, "ready": was_ready},
                after={"state": member.state, "reason": member.reason, "ready": member.ready},
            )
    member_release(member, command, actor, fleet_id)


def member_release(member: Member, command: NodeCommand, actor: Actor, fleet_id) -> None:
    """R7: once its node confirms the cleanup, a member's cards are released (audited) and
    its Fleet gets an allocation pass. ``fleet_id`` is called only then."""
    if command.cleaned_at is None or member.cleanup == Cleanup.CLEANED:
        return
    member.cleanup = Cleanup.CLEANED
    member.save(update_fields=["cleanup"])
    CardHold.objects.filter(member=member).delete()
    audit_record(
        actor=actor,
        action="member.cleaned",
        target=member,
        before={"cleanup": Cleanup.PENDING},
        after={"cleanup": Cleanup.CLEANED, "cards_released": member.cards},
    )
    allocate_on_commit(fleet_id() if callable(fleet_id) else fleet_id)


def members_send(kind: str, members: list[Member], now=None, **extra) -> None:
    """A stop (with the grace, unless given) or a cleanup command for each member, recorded
    on it so that none is sent twice."""
    now = now or timezone.now()
    stamp = "stop_requested_at" if kind == CommandKind.STOP else "cleanup_requested_at"
    if kind == CommandKind.STOP:
        extra.setdefault("grace_seconds", stop_grace())
    # An abandoned member's node is removed (D3): it takes no commands, and its cards with it.
    members = [
        member
        for member in members
        if getattr(member, stamp) is None and member.state != RunState.ABANDONED
    ]
    if not members:
        return
    node_commands_create_many(
        actor=RUNS,
        commands=[(m.node_id, kind, {"member": m.command_id, **extra}) for m in members],
    )
    Member.objects.filter(pk__in=[m.pk for m in members]).update(**{stamp: now})
    for member in members:
        setattr(member, stamp, now)


def members_stop(members: list[Member], now=None) -> None:
    """The live ones of ``members`` stopped: SIGTERM, SIGKILL after the grace (R10)."""
    members_send(CommandKind.STOP, [m for m in members if m.state in RUN_LIVE], now)


def members_clean(members: list[Member], now=None) -> None:
    """The ended ones of ``members`` cleaned up (R7)."""
    members_send(CommandKind.CLEANUP, [m for m in members if m.state not in RUN_LIVE], now)


def stop_grace() -> int:
    return settings.TUNEPLANE_STOP_GRACE
