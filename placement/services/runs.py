"""Attempts and members as their nodes report them, and a job's state from its attempts.

nodes carries the reports and never imports placement: placement.services.reports hears
them inside the transaction that stored a command's change and hands a job's member to
``attempt_member_reported``. The member moves (members.member_follow); its attempt and its
job follow, each move one audit event (R10, A1) through their lifecycles (placement.choices):
every member running → the attempt and the job run; a member failing fails the attempt and
stops the others (R3); an ended member is cleaned up, and its cards are released only when
the node confirms it (R7), which starts an allocation pass.

An attempt's end has a class (H1, placement.faults): the machine's (``infrastructure``) or
the job's own (``user``). Only user ends spend ``max_attempts``; an infrastructure end
retries on the job's own budget (``infra_retries``) after a backoff, away from the node or
cards that failed it (H2); a user end retries only for an exit code the job listed, or a
missed gang deadline (H3, R9).
"""

from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from audit.services import Actor, audit_record
from fleets.choices import FleetKind
from nodes.choices import SchedulingState
from nodes.models import Node, NodeCommand
from tuneplane.errors import Conflict
from tuneplane.lifecycle import move

from .. import faults
from ..choices import (
    ATTEMPT_LIFECYCLE,
    JOB_ENDED,
    JOB_LIFECYCLE,
    RUN_LIVE,
    EndClass,
    JobState,
    RunState,
)
from ..handover import cluster_job_cancel_on_commit
from ..models import Attempt, LifecycleJob, Member, TrainingJob
from .members import RUNS, member_follow, members_clean, members_stop
from .passes import allocate_on_commit


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
        if state not in RUN_LIVE:
            attempt_end(attempt, members, state, reason, now)
        elif state != attempt.state:
            fields = {"started_at": attempt.started_at or now} if state == RunState.RUNNING else {}
            move(attempt, ATTEMPT_LIFECYCLE, state, actor=RUNS, reason=reason, fields=fields)
    if attempt.state not in RUN_LIVE:
        members_stop(live, now)  # R3: one member failing stops the others
    members_clean(members, now)
    _job_settle(job, attempt, members, now)


def attempt_end(attempt: Attempt, members: list[Member], state: str, reason: str, now) -> None:
    """The attempt ends ``state`` for ``reason``, with its class (H1), audited."""
    end = faults.end_class(state, reason, _member_ends(attempt, members, now))
    move(
        attempt,
        ATTEMPT_LIFECYCLE,
        state,
        actor=RUNS,
        reason=reason,
        fields={"ended_at": now, "end_class": end},
        after={"end_class": end},
    )


def _member_ends(attempt: Attempt, members: list[Member], now) -> list[faults.MemberEnd]:
    """What placement.faults reads of each member: its end, whether its node is gone, and
    its cards judged unhealthy since the attempt began (H1). One query for the nodes."""
    nodes = {
        node_id: (state, unhealthy or {}, inventory or {})
        for node_id, state, unhealthy, inventory in Node.objects.filter(
            pk__in={m.node_id for m in members}
        ).values_list("id", "scheduling_state", "unhealthy_cards", "inventory")
    }
    ends = []
    for member in members:
        state, unhealthy, inventory = nodes.get(member.node_id, ("", {}, {}))
        faulted = tuple(
            (card["index"], card["uuid"])
            for card in member.cards
            if _since(unhealthy.get(card["uuid"]), attempt.created_at)
        )
        devices = {device.get("uuid") for device in inventory.get("devices") or []}
        healthy = devices - set(unhealthy) - {uuid for _, uuid in faulted}
        ends.append(
            faults.MemberEnd(
                node=member.node_id,
                state=member.state,
                reason=member.reason,
                exit_code=member.exit_code,
                started=member.started_at is not None,
                runtime=faults.under_runtime(member.confinement),
                faulted=faulted,
                others_healthy=bool(healthy),
                node_gone=state == SchedulingState.GONE,
            )
        )
    return ends


def _since(card: dict | None, began) -> bool:
    """Whether a card judged unhealthy was judged so at or after ``began``."""
    if not card:
        return False
    try:
        return datetime.fromisoformat(card.get("since") or "") >= began
    except ValueError:
        return True  # unhealthy, when unknown: it was given to the attempt healthy


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
    if not live and any(m.state == RunState.CANCELLED for m in members):
        # Stopped by what no cancel or preemption asked (H6: its card failed; an operator's
        # stop): the attempt is over, and H1 says whose its end was.
        return RunState.FAILED, "stopped"
    if members and all(m.started_at is not None for m in members):
        # Every member started (a fast one may have finished already): it runs.
        return RunState.RUNNING, attempt.reason
    return attempt.state, attempt.reason


def _job_settle(job, attempt: Attempt, members: list[Member], now) -> None:
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
        return _after_failure(job, attempt, members, now)
    if (state, reason) != (job.state, job.reason):
        job_move(job, state, reason=reason, now=now)


def _after_failure(job, attempt: Attempt, members: list[Member], now) -> None:
    """H2, H3, R9: a failed or lost attempt's job is queued again or fails. An
    infrastructure retry waits its backoff and excludes what failed it, both on the job."""
    ends = _member_ends(attempt, members, now)
    user_ends, infra_ends = _ends_counted(job)
    after = faults.next_after(
        end=attempt.end_class or faults.end_class(attempt.state, attempt.reason, ends),
        reason=attempt.reason,
        exit_code=faults.deciding_exit_code(attempt.reason, ends),
        user_ends=user_ends,
        max_attempts=job.max_attempts,
        infra_ends=infra_ends,
        infra_retries=faults.infra_retries_of(job.fleet),
        on_exit_codes=job.retry_on_exit_codes or (),
        backoff_first=settings.TUNEPLANE_INFRA_BACKOFF_FIRST,
        backoff_max=settings.TUNEPLANE_INFRA_BACKOFF_MAX,
    )
    if not after.retry:
        job_move(job, JobState.FAILED, reason=after.reason, now=now)
        return
    fields: dict = {}
    shown: dict = {"end_class": attempt.end_class, "attempt": attempt.number}
    if after.backoff is not None:
        fields["not_before"] = now + after.backoff
        shown["not_before"] = fields["not_before"].isoformat()
        laid = faults.excluded(attempt.reason, ends)
        if laid.nodes or laid.cards:
            fields["excluded"] = _excluded_with(job.excluded, laid, attempt.number, now)
            shown["excluded"] = fields["excluded"]
    job_move(job, JobState.QUEUED, reason=after.reason, now=now, after=shown, **fields)
    allocate_on_commit(job.fleet_id)


def attempts_used(job) -> int:
    """R9, H2, Q6: the attempts that count against ``max_attempts`` — its user ends only."""
    return _ends_counted(job)[0]


def _ends_counted(job) -> tuple[int, int]:
    """H2, Q6: the job's attempts ended ``user`` (what ``max_attempts`` counts) and ended
    ``infrastructure`` (what ``infra_retries`` counts); a preempted one is neither. One query."""
    counted = Attempt.objects.filter(**{Attempt.job_field(job): job}).aggregate(
        user=Count("pk", filter=Q(end_class=EndClass.USER)),
        infra=Count("pk", filter=Q(end_class=EndClass.INFRASTRUCTURE)),
    )
    return counted["user"], counted["infra"]


def _excluded_with(current: dict, laid: faults.Excluded, attempt: int, now) -> dict:
    """The job's exclusions with what an attempt's end laid to added (H2): each node and
    card once, with its fault, the attempt and when."""
    nodes = list((current or {}).get("nodes") or [])
    cards = list((current or {}).get("cards") or [])
    known_nodes = {entry["node"] for entry in nodes}
    known_cards = {(entry["node"], entry["uuid"]) for entry in cards}
    at = now.isoformat()
    for node, fault in sorted(laid.nodes.items()):
        if node not in known_nodes:
            nodes.append({"node": node, "reason": fault, "attempt": attempt, "at": at})
    for (node, index, uuid), fault in sorted(laid.cards.items()):
        if (node, uuid) not in known_cards:
            cards.append(
                {
                    "node": node,
                    "index": index,
                    "uuid": uuid,
                    "reason": fault,
                    "attempt": attempt,
                    "at": at,
                }
            )
    return {"nodes": nodes, "cards": cards}


def job_move(
    job, state: str, *, reason: str, now, actor: Actor = RUNS, after=None, **fields
) -> None:
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
        after=after,
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


def job_excluded_clear(*, actor: Actor, job):
    """H2: an administrator clears the nodes and cards a job's next attempts stay away from
    (the machine was mended, say), audited with what was excluded; a queued job then gets an
    allocation pass. Nothing excluded: nothing written."""
    with transaction.atomic():
        job = type(job).objects.select_for_update().get(pk=job.pk)
        before = job.excluded or {}
        if not (before.get("nodes") or before.get("cards")):
            return job
        job.excluded = {}
        job.save(update_fields=["excluded"])
        audit_record(
            actor=actor,
            action=f"{job._meta.model_name}.excluded_cleared",
            target=job,
            before={"excluded": before},
            after={"excluded": {}},
        )
        if job.state == JobState.QUEUED and job.fleet.kind == FleetKind.NODE:
            allocate_on_commit(job.fleet_id)
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
