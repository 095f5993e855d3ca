"""Attempts and members as their nodes report them, and a job's state from its attempts.

nodes carries the reports and never imports placement: placement.services.reports hears
them inside the transaction that stored a command's change and hands a job's member to
``attempt_member_reported``. The member moves (members.member_follow); its attempt and its
job follow, each move one audit event (R10, A1) through their lifecycles (placement.choices):
every member running → the attempt and the job run; a member failing fails the attempt and
stops the others (R3); an ended member is cleaned up, and its cards are released only when
the node confirms it (R7), which starts an allocation pass.
"""

from django.db import transaction
from django.utils import timezone

from audit.services import Actor, audit_record
from fleets.choices import FleetKind
from nodes.models import NodeCommand
from tuneplane.errors import Conflict
from tuneplane.lifecycle import move

from ..choices import ATTEMPT_LIFECYCLE, JOB_ENDED, JOB_LIFECYCLE, RUN_LIVE, JobState, RunState
from ..handover import cluster_job_cancel_on_commit
from ..models import Attempt, LifecycleJob, Member, TrainingJob
from .members import RUNS, member_follow, members_clean, members_stop
from .passes import allocate_on_commit

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


def attempt_member_reported(attempt_id: int, command: NodeCommand, before: dict) -> None:
    """A node's report moved the start command of one of this attempt's members: the member
    follows (members.member_follow), then the attempt and its job."""
    job, attempt, members = locked_run(attempt_id)
    member = next(m for m in members if m.command_id == command.pk)
    member_follow(member, command, before, actor=RUNS, fleet_id=attempt.fleet_id)
    attempt_settle(attempt_id, locked=(job, attempt, members))


def attempt_settle(attempt_id: int, locked=None) -> None:
    """An attempt follows its members; its job follows it; what ended is cleaned up and, once
    the attempt has ended, what still runs of it is stopped (R3, R7). Call inside a
    transaction; ``locked`` is ``locked_run``'s answer when the caller has it."""
    now = timezone.now()
    job, attempt, members = locked or locked_run(attempt_id)
    live = [m for m in members if m.state in RUN_LIVE]
    if attempt.state in RUN_LIVE:
        state, reason = attempt_state(job, attempt, members)
        if state != attempt.state:
            move(
                attempt,
                ATTEMPT_LIFECYCLE,
                state,
                actor=RUNS,
                reason=reason,
                fields={"started_at": attempt.started_at or now}
                if state == RunState.RUNNING
                else {"ended_at": now}
                if state not in RUN_LIVE
                else {},
            )
    if attempt.state not in RUN_LIVE:
        members_stop(live, now)  # R3: one member failing stops the others
    members_clean(members, now)
    _job_settle(job, attempt, now)


def attempt_state(job, attempt: Attempt, members: list[Member]) -> tuple[str, str]:
    """What a live attempt is, from its members (R3, R10): a pure decision."""
    live = [m for m in members if m.state in RUN_LIVE]
    failed = next(
        (m for m in members if m.state in (RunState.FAILED, RunState.LOST, RunState.ABANDONED)),
        None,
    )
    if job.cancel_requested_at is not None and failed is None and not live:
        return RunState.CANCELLED, "cancelled"
    if failed is not None:
        if job.cancel_requested_at is not None and failed.reason == "stopped":
            return RunState.CANCELLED, "cancelled"
        given_up = failed.state in (RunState.LOST, RunState.ABANDONED)
        return (RunState.LOST if given_up else RunState.FAILED), failed.reason or "exit"
    if members and all(m.state == RunState.SUCCEEDED for m in members):
        return RunState.SUCCEEDED, "exit"
    if job.state == JobState.PREEMPTING and not live:
        # Q6: stopped for a preemptor; neither a failure nor an attempt used.
        return RunState.PREEMPTED, "preempted"
    if members and all(m.started_at is not None for m in members):
        # Every member started (a fast one may have finished already): it runs.
        return RunState.RUNNING, attempt.reason
    return attempt.state, attempt.reason


def _job_settle(job, attempt: Attempt, now) -> None:
    """The job follows its latest attempt only: two attempts never both count (R9)."""
    later = Attempt.objects.filter(
        **{Attempt.job_field(job): job}, number__gt=attempt.number
    ).exists()
    if job.state in JOB_ENDED or later:
        return
    state, reason = job.state, job.reason
    if attempt.state == RunState.RUNNING:
        if job.state != JobState.PREEMPTING:  # preempting: it runs until its members stop
            state = JobState.RUNNING
    elif attempt.state == RunState.SUCCEEDED:
        state, reason = JobState.SUCCEEDED, ""
    elif attempt.state == RunState.CANCELLED or job.cancel_requested_at is not None:
        # Asked to stop: however the attempt ends, nothing runs again (R10).
        state, reason = JobState.CANCELLED, "cancelled"
    elif attempt.state == RunState.PREEMPTED:
        # Q6: queued again in its place (admission order), for the preemptor to go first.
        state, reason = JobState.QUEUED, "preempted"
        allocate_on_commit(job.fleet_id)
    elif attempt.state in (RunState.FAILED, RunState.LOST):
        if attempt.reason in RETRIED and attempts_used(job) < job.max_attempts:
            state, reason = JobState.QUEUED, f"retrying after {attempt.reason}"
            allocate_on_commit(job.fleet_id)
        else:
            state, reason = JobState.FAILED, attempt.reason
    if (state, reason) != (job.state, job.reason):
        job_move(job, state, reason=reason, now=now)


def attempts_used(job) -> int:
    """R9, Q6: the attempts that count against ``max_attempts`` — a preempted one never does."""
    return (
        Attempt.objects.filter(**{Attempt.job_field(job): job})
        .exclude(state=RunState.PREEMPTED)
        .count()
    )


def job_move(job, state: str, *, reason: str, now, actor: Actor = RUNS, **fields) -> None:
    """A job's move (JOB_LIFECYCLE), audited as ``<its model>.<state>``; an ended job's end."""
    if state in JOB_ENDED:
        fields["ended_at"] = now
    move(
        job,
        JOB_LIFECYCLE,
        state,
        actor=actor,
        reason=reason,
        action=f"{job._meta.model_name}.{state}",
        fields=fields,
    )


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
        handed_over = bool(getattr(job, "handover_key", ""))
        if job.fleet.kind != FleetKind.NODE and handed_over:
            return _cluster_cancel(actor, job, now)
        if job.state == JobState.QUEUED:
            job_move(
                job,
                JobState.CANCELLED,
                reason="cancelled",
                now=now,
                actor=actor,
                cancel_requested_at=now,
            )
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
                members_stop(members, now)
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
