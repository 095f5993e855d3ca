"""Attempts and members as their nodes report them, and a job's state from its attempts.

nodes carries the reports and never imports placement: ``member_command_observed`` is
registered with it (placement.apps) and called inside the transaction that stored a
command's change. From a member's change follow its attempt's and its job's, each one audit
event (R10, A1): every member running → the attempt and the job run; a member failing
fails the attempt and stops the others (R3); an ended member is cleaned up, and its cards
are released only when the node confirms it (R7), which starts an allocation pass.
"""

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.services import Actor, audit_record
from fleets.choices import FleetKind
from nodes.choices import CommandKind, CommandState
from nodes.models import NodeCommand
from nodes.services.commands import node_command_cleaned_by_id, node_commands_create_many
from nodes.services.logs import log_tail_fetch
from tuneplane.errors import Conflict, NotFound

from ..choices import JOB_ENDED, RUN_LIVE, Cleanup, JobState, RunState
from ..handover import cluster_job_cancel_on_commit
from ..models import Attempt, CardHold, LifecycleJob, Member, TrainingJob
from .allocator import allocate_on_commit

RUNS = Actor.system("runs")
# Why a member ended, in the node's words, and what the member's state becomes.
ENDED_AS = {
    CommandState.SUCCEEDED: RunState.SUCCEEDED,
    CommandState.FAILED: RunState.FAILED,
    CommandState.LOST: RunState.FAILED,
}
# An attempt that ended for one of these is the machine's fault, not the job's: the job
# gets another attempt while it has attempts left (R9). A non-zero exit or an OOM is not.
RETRIED = {
    "lost",
    "abandoned",
    "vanished",
    "node_rebooted",
    "gang_deadline",
    "refused",
    "start_failed",
}


def _audit(record, action: str, before: dict, actor: Actor = RUNS) -> None:
    audit_record(
        actor=actor,
        action=action,
        target=record,
        before=before,
        after={"state": record.state, "reason": record.reason},
    )


def locked_run(attempt_id: int):
    """The job, the attempt and its members by rank, locked in that order — the one order
    every writer of runs takes (after a node command, which a report has locked first), so
    that two of them never wait on each other."""
    training_job_id, lifecycle_job_id = (
        Attempt.objects.filter(pk=attempt_id)
        .values_list("training_job_id", "lifecycle_job_id")
        .get()
    )
    if training_job_id:
        job = TrainingJob.objects.select_for_update().get(pk=training_job_id)
    else:
        job = LifecycleJob.objects.select_for_update().get(pk=lifecycle_job_id)
    attempt = Attempt.objects.select_for_update().get(pk=attempt_id)
    members = list(attempt.members.select_for_update().order_by("rank"))
    return job, attempt, members


def member_command_observed(command: NodeCommand, before: dict) -> None:
    """A node's report moved one of its commands: follow it in the member it stands for."""
    if (
        command.kind == CommandKind.CLEANUP
        and command.state == CommandState.SUCCEEDED
        and command.reason == "unknown_member"
    ):
        # The node did not know the member (its state was lost) and cleaned up by its id:
        # nothing of it is left there. A member it knows says so itself (R7).
        start = (
            NodeCommand.objects.select_for_update()
            .filter(pk=command.payload.get("member"), node_id=command.node_id)
            .first()
        )
        if start is not None:
            node_command_cleaned_by_id(command=start)
        return
    if command.kind != CommandKind.START:
        return
    attempt_id = Member.objects.filter(command=command).values_list("attempt_id", flat=True).first()
    if attempt_id is not None:
        job, attempt, members = locked_run(attempt_id)
        member = next(m for m in members if m.command_id == command.pk)
        _member_moved(member, command, before)
        _attempt_settle(attempt_id, locked=(job, attempt, members))


def _member_moved(member: Member, command: NodeCommand, before_command: dict) -> None:
    """The member as its start command now says; its attempt is settled by the caller."""
    now = timezone.now()
    before = {"state": member.state, "reason": member.reason}
    if member.state in RUN_LIVE:
        if command.state == CommandState.RUNNING and command.reason == "unkillable":
            member.reason = "unkillable"  # its node is cordoned for it; cards stay held
        if command.state == CommandState.RUNNING and member.state != RunState.RUNNING:
            member.state, member.started_at = RunState.RUNNING, member.started_at or now
        elif command.state in ENDED_AS:
            given_up = command.state == CommandState.LOST and command.reason == "lost"
            abandoned = command.state == CommandState.LOST and command.reason == "abandoned"
            member.state = (
                RunState.LOST
                if given_up
                else RunState.ABANDONED
                if abandoned
                else ENDED_AS[command.state]
            )
            member.exit_code = command.exit_code
            member.reason = command.reason or "vanished"
            member.ended_at = now
    elif command.state == CommandState.RUNNING and before_command.get("state") != "running":
        # R9: a given-up member still running on a node that came back. It never counts
        # again; the cleanup sent when it was given up stops it.
        audit_record(
            actor=RUNS,
            action="member.leftover_running",
            target=member,
            before={"state": member.state},
            after={"state": member.state, "node_reports": "running"},
        )
    member.confinement = command.confinement
    if (member.state, member.reason) != (before["state"], before["reason"]):
        member.save()
        _audit(member, f"member.{member.state}", before)
    elif member.confinement:
        member.save(update_fields=["confinement"])
    _cleaned(member, command, RUNS, lambda: member.attempt.fleet_id)


def _cleaned(member: Member, command: NodeCommand, actor: Actor, fleet_id) -> None:
    """R7: once its node confirms the cleanup, a member's cards are released (audited) and
    its Fleet gets an allocation pass. Every kind of member — a job's, a replica, a
    session's, an episode's — is released here. ``fleet_id`` is called only then."""
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
    allocate_on_commit(fleet_id())


def _send(kind: str, members: list[Member], now, **extra) -> None:
    """Stop or cleanup commands for members, recorded on them so none is sent twice."""
    stamp = "stop_requested_at" if kind == CommandKind.STOP else "cleanup_requested_at"
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


def _attempt_settle(attempt_id: int, locked=None) -> None:
    """An attempt follows its members; its job follows it."""
    now = timezone.now()
    job, attempt, members = locked or locked_run(attempt_id)
    before = {"state": attempt.state, "reason": attempt.reason}
    live = [m for m in members if m.state in RUN_LIVE]
    ended = [m for m in members if m.state not in RUN_LIVE]
    if attempt.state in RUN_LIVE:
        failed = next(
            (m for m in members if m.state in (RunState.FAILED, RunState.LOST, RunState.ABANDONED)),
            None,
        )
        if job.cancel_requested_at is not None and failed is None and not live:
            attempt.state, attempt.reason = RunState.CANCELLED, "cancelled"
        elif failed is not None:
            cancelled = job.cancel_requested_at is not None and failed.reason == "stopped"
            attempt.state = (
                RunState.CANCELLED
                if cancelled
                else RunState.LOST
                if failed.state in (RunState.LOST, RunState.ABANDONED)
                else RunState.FAILED
            )
            attempt.reason = "cancelled" if cancelled else failed.reason or "exit"
        elif members and all(m.state == RunState.SUCCEEDED for m in members):
            attempt.state, attempt.reason = RunState.SUCCEEDED, "exit"
        elif members and all(m.started_at is not None for m in members):
            # Every member started (a fast one may have finished already): it runs.
            attempt.state, attempt.started_at = RunState.RUNNING, attempt.started_at or now
        if attempt.state not in RUN_LIVE:
            attempt.ended_at = now
        if attempt.state != before["state"]:
            attempt.save()
            _audit(attempt, f"attempt.{attempt.state}", before)
    if attempt.state not in RUN_LIVE:
        # R3: one member failing stops the others; what ended is cleaned up (R7).
        _send(CommandKind.STOP, live, now, grace_seconds=settings.TUNEPLANE_STOP_GRACE)
    _send(CommandKind.CLEANUP, ended, now)
    _job_settle(job, attempt, now)


def _job_settle(job, attempt: Attempt, now) -> None:
    """The job follows its latest attempt only: two attempts never both count (R9)."""
    later = Attempt.objects.filter(
        **{Attempt.job_field(job): job}, number__gt=attempt.number
    ).exists()
    if job.state in JOB_ENDED or later:
        return
    before = {"state": job.state, "reason": job.reason}
    if attempt.state == RunState.RUNNING:
        job.state = JobState.RUNNING
    elif attempt.state == RunState.SUCCEEDED:
        job.state, job.reason = JobState.SUCCEEDED, ""
    elif attempt.state == RunState.CANCELLED or job.cancel_requested_at is not None:
        # Asked to stop: however the attempt ended, nothing runs again (R10).
        job.state, job.reason = JobState.CANCELLED, "cancelled"
    elif attempt.state in (RunState.FAILED, RunState.LOST):
        if attempt.reason in RETRIED and attempt.number < job.max_attempts:
            job.state, job.reason = JobState.QUEUED, f"retrying after {attempt.reason}"
            allocate_on_commit(job.fleet_id)
        else:
            job.state, job.reason = JobState.FAILED, attempt.reason
    if job.state in JOB_ENDED:
        job.ended_at = now
    if (job.state, job.reason) != (before["state"], before["reason"]):
        job.save(update_fields=["state", "reason", "ended_at"])
        _audit(job, f"{job._meta.model_name}.{job.state}", before)


def job_cancel(*, actor: Actor, job):
    """R10: a queued job is cancelled at once; a starting or running one is stopped —
    SIGTERM to its process groups, SIGKILL after the grace — and ends cancelled once its
    members are stopped; its cards are released after their cleanup."""
    now = timezone.now()
    with transaction.atomic():
        job = type(job).objects.select_for_update().get(pk=job.pk)
        if job.state in JOB_ENDED:
            raise Conflict(
                f"The job has already {job.state}; there is nothing to cancel.",
                code="job_ended",
            )
        before = {"state": job.state, "reason": job.reason}
        handed_over = bool(getattr(job, "handover_key", ""))
        if job.fleet.kind != FleetKind.NODE and handed_over:
            return _cluster_cancel(actor, job, now)
        if job.state == JobState.QUEUED:
            job.state, job.reason, job.ended_at = JobState.CANCELLED, "cancelled", now
            job.cancel_requested_at = now
            job.save(update_fields=["state", "reason", "ended_at", "cancel_requested_at"])
            _audit(job, f"{job._meta.model_name}.cancelled", before, actor)
            return job
        if job.cancel_requested_at is None:
            _cancel_requested(actor, job, now)
            latest = (
                Attempt.objects.filter(**{Attempt.job_field(job): job})
                .order_by("-number")
                .values_list("pk", flat=True)
                .first()
            )
            if latest is not None:  # locked in the one order (locked_run), the job first
                _, _, members = locked_run(latest)
                live = [m for m in members if m.state in RUN_LIVE]
                _send(CommandKind.STOP, live, now, grace_seconds=settings.TUNEPLANE_STOP_GRACE)
    return job


def _cancel_requested(actor: Actor, job, now) -> None:
    job.cancel_requested_at = now
    job.save(update_fields=["cancel_requested_at"])
    audit_record(
        actor=actor,
        action=f"{job._meta.model_name}.cancel_requested",
        target=job,
        before={"cancel_requested_at": None},
        after={"cancel_requested_at": now.isoformat(), "state": job.state},
    )


def _cluster_cancel(actor: Actor, job, now):
    """A job a cluster Fleet's manager has (or may have, mid-handover): the manager is asked
    to stop it; its CANCELLED, read back, ends it."""
    if job.cancel_requested_at is None:
        _cancel_requested(actor, job, now)
        cluster_job_cancel_on_commit(job)
    return job


def member_output(*, job, attempt: int | None = None, rank: int = 0, tail_bytes: int = 65536):
    """Which member a logs request means (the latest attempt unless one is named) and the
    tail of its output, from its node now (nodes.services.logs). A read: not audited."""
    members = Member.objects.select_related("attempt", "node").filter(
        **{f"attempt__{Attempt.job_field(job)}": job}, rank=rank
    )
    if attempt is not None:
        members = members.filter(attempt__number=attempt)
    member = members.order_by("-attempt__number").first()
    if member is None:
        raise NotFound(
            "No such member: the job has no attempt yet, or not that attempt or rank.",
            field="attempt" if attempt is not None else "rank",
        )
    return member, log_tail_fetch(node=member.node, member=member.command_id, tail_bytes=tail_bytes)
