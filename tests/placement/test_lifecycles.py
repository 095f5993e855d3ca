"""Each record's lifecycle, walked (issue 36; R3, R8–R10, S1–S5, D3, L5 by their moves).

Every move a table does not allow is refused, and refused before anything is written; every
move a table allows is made by some service. The second half runs the services the way
their callers do — a node's report through nodes.services.commands, a sweep, a cancel, an
operator's removal — each flow on the same two placeable nodes in a savepoint of its own,
and notes every move they make (``tuneplane.lifecycle.recording``). A move a table allows
that no flow makes is a move no code makes: it leaves the table, or a flow is missing.
"""

from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import Actor
from fleets.models import Fleet
from nodes.choices import COMMAND_LIFECYCLE
from nodes.models import Node
from nodes.services.commands import Reported, node_command_report, node_commands_reconcile
from nodes.services.removal import node_remove
from placement.choices import (
    EPISODE_ENDED,
    JOB_ENDED,
    JOB_LIFECYCLE,
    LIFECYCLES,
    RUN_LIVE,
    RunState,
)
from placement.models import Attempt, Member, TrainingJob
from placement.services import episodes, playground, runs, serving, submission
from placement.services.allocator import allocate
from placement.services.quotas import QuotaSpec, quotas_replace
from placement.services.reconcile import members_reconcile
from tests.conftest import SERVE, SYSTEM
from tuneplane.lifecycle import IllegalMove, move, recording
from tuneplane.models import Membership, Project

ALL = (*LIFECYCLES, COMMAND_LIFECYCLE)
LATER = timedelta(days=1)


@pytest.mark.parametrize("lifecycle", ALL, ids=lambda lifecycle: lifecycle.name)
def test_every_move_the_table_does_not_allow_is_refused(lifecycle):
    states = lifecycle.states()
    for old in states:
        for new in states - {old}:
            if lifecycle.allows(old, new):
                lifecycle.check(old, new)
            else:
                with pytest.raises(IllegalMove):
                    lifecycle.check(old, new)


def test_a_records_ends_in_its_table_are_the_ends_the_code_reads():
    """The states a table lets nothing leave are the ones the services treat as ended:
    JOB_ENDED, EPISODE_ENDED, a run that is not RUN_LIVE, a command that may no more run."""
    ends = {
        lifecycle.name: {state for state in lifecycle.states() if lifecycle.final(state)}
        for lifecycle in ALL
    }
    assert ends["job"] == set(JOB_ENDED)
    assert ends["episode"] == set(EPISODE_ENDED)
    # Only a member is abandoned with its node (D3); only an attempt is preempted (Q6).
    assert ends["member"] == set(RunState.values) - set(RUN_LIVE) - {RunState.PREEMPTED}
    assert ends["attempt"] == set(RunState.values) - set(RUN_LIVE) - {RunState.ABANDONED}
    assert ends["node_command"] == {"succeeded", "failed"}
    for name in ("revision", "deployment", "playgroundsession"):
        assert "live" not in ends[name] and ends[name]


def test_a_refused_move_writes_nothing(lab, member):
    record = job(member)
    runs.job_cancel(actor=Actor.of_user(member), job=record)
    record.refresh_from_db()
    events = AuditEvent.objects.count()
    with pytest.raises(IllegalMove) as refused:
        move(record, JOB_LIFECYCLE, "running", actor=SYSTEM)
    assert refused.value.details == {"lifecycle": "job", "state": "cancelled", "to": "running"}
    assert record.state == "cancelled"  # not even the object in hand
    assert TrainingJob.objects.get(pk=record.pk).state == "cancelled"
    assert AuditEvent.objects.count() == events


@pytest.fixture
def lab(node_fleet, gpu_node):
    """A node Fleet that trains, serves and runs environments, with two placeable nodes."""
    node_fleet.capabilities = ["train", "serve", "env"]
    node_fleet.save(update_fields=["capabilities"])
    return [gpu_node(node_fleet, address=f"10.0.0.{n}:1") for n in (1, 2)]


def job(user, **fields) -> TrainingJob:
    return submission.training_job_submit(
        actor=Actor.of_user(user), project="ml", name="job", command=["true"], cards=1, **fields
    )


def placed(user, **fields) -> tuple[TrainingJob, list[Member]]:
    record = job(user, **fields)
    allocate(fleet_id=record.fleet_id)
    return record, list(Member.objects.filter(attempt__training_job=record).order_by("rank"))


def report(member: Member, state: str = "running", exit_code=None, reason: str = "", **fields):
    node_command_report(
        node_id=member.node_id,
        reported=Reported(member.command_id, state, exit_code, reason, **fields),
    )


def running(user, **fields):
    record, members = placed(user, **fields)
    for one in members:
        report(one)
    return record, members


def gone(member: Member) -> None:
    """Its node declared gone just now: the reconcile deadline is a day away (LATER)."""
    Node.objects.filter(pk=member.node_id).update(
        scheduling_state="gone", last_seen_at=timezone.now()
    )


def back(member: Member, *reported: Reported) -> None:
    Node.objects.filter(pk=member.node_id).update(scheduling_state="schedulable")
    node_commands_reconcile(node_id=member.node_id, reported=list(reported))


def cancel(record) -> None:
    runs.job_cancel(actor=SYSTEM, job=record)


# --- Jobs, attempts, members, node commands ---


def succeeds(user):
    _, [one] = running(user)
    report(one, "succeeded", 0, "exit")


def succeeds_at_once(user):
    _, [one] = placed(user)
    report(one, "succeeded", 0, "exit")


def fails_starting(user):
    _, [one] = placed(user)
    report(one, "failed", 1, "exit")


def fails_running(user):
    _, [one] = running(user)
    report(one, "failed", 1, "exit")


def cancelled_queued(user):
    cancel(job(user))


def cancelled_starting(user):
    record, [one] = placed(user)
    cancel(record)
    report(one, "failed", -15, "stopped")


def cancelled_running(user):
    record, [one] = running(user)
    cancel(record)
    report(one, "failed", -15, "stopped")


def gone_back_then_given_up_and_left_over(user):
    """R8, R9: unknown, running again, unknown, lost and retried; the leftover, reported
    running when its node returns, is stopped by the cleanup sent when it was given up."""
    _, [one] = running(user)
    gone(one)
    members_reconcile()
    back(one, Reported(one.command_id, "running"))
    members_reconcile()
    gone(one)
    members_reconcile()
    members_reconcile(now=timezone.now() + LATER)
    back(one, Reported(one.command_id, "running"))
    report(one, "failed", -15, "stopped")


def gone_while_starting_and_given_up(user):
    _, [one] = placed(user)
    gone(one)
    members_reconcile()
    members_reconcile(now=timezone.now() + LATER)
    back(one, Reported(one.command_id, "succeeded", 0, "exit"))


def given_up_then_back_with_it_failed(user):
    _, [one] = running(user)
    gone(one)
    members_reconcile()
    members_reconcile(now=timezone.now() + LATER)
    back(one, Reported(one.command_id, "failed", 1, "exit"))


def back_with_it_finished(user):
    _, [one] = running(user)
    gone(one)
    members_reconcile()
    back(one, Reported(one.command_id, "succeeded", 0, "exit"))


def back_without_it(user):
    _, [one] = running(user)
    gone(one)
    members_reconcile()
    back(one)


def cancelled_while_unknown(user):
    record, [one] = running(user)
    gone(one)
    members_reconcile()
    cancel(record)
    report(one, "failed", -15, "stopped")


def removed_by_force(member: Member) -> None:
    gone(member)
    node_remove(actor=SYSTEM, node=Node.objects.get(pk=member.node_id), force=True)


def abandoned_running(user):
    _, [one] = running(user)
    removed_by_force(one)


def abandoned_starting(user):
    _, [one] = placed(user)
    removed_by_force(one)


def abandoned_unknown(user):
    _, [one] = running(user)
    gone(one)
    members_reconcile()
    removed_by_force(one)


def gang_past_its_deadline(user):
    """R3: one of two members running at the deadline; the attempt fails, the job queues."""
    _, [first, _] = placed(user, nodes=2)
    report(first)
    members_reconcile(now=timezone.now() + LATER)


# --- Deployments, revisions, replicas; playground sessions; episodes ---


def deploy(user, **fields):
    return submission.deployment_submit(
        actor=Actor.of_user(user), project="ml", name="chat", **{**SERVE, **fields}
    )


def replicas(deployment, number):
    return list(Member.objects.filter(revision__deployment=deployment, revision__number=number))


def rolled_out_then_stopped(user):
    deployment = deploy(user)
    allocate(fleet_id=deployment.fleet_id)
    [old] = replicas(deployment, 1)
    report(old, ready=True)
    serving.revision_create(actor=SYSTEM, deployment=deployment, env={"V": "2"}, port=8001)
    allocate(fleet_id=deployment.fleet_id)
    [new] = replicas(deployment, 2)
    report(new, ready=True)  # the old revision retires; its replica is stopped
    report(old, "failed", -15, "stopped")
    serving.deployment_update(actor=SYSTEM, deployment=deployment, state="stopped")


def rolled_back(user):
    deployment = deploy(user)
    allocate(fleet_id=deployment.fleet_id)
    serving.revision_create(actor=SYSTEM, deployment=deployment, env={"V": "2"}, port=8001)
    serving.rollouts_settle(now=timezone.now() + LATER)


def session_ended(user):
    session = submission.playground_session_submit(
        actor=Actor.of_user(user), project="ml", name="try", **SERVE
    )
    playground.session_end(actor=SYSTEM, session=session)


def environment(user):
    return submission.environment_submit(
        actor=Actor.of_user(user), project="ml", name="env", manifest={"fleet": "gpu-lab"}
    )


def episode(user, place: bool = True):
    started = episodes.episode_start(actor=SYSTEM, environment=environment(user), command=["x"])
    if place:
        allocate(fleet_id="gpu-lab")
    return started, Member.objects.filter(episode=started).first()


def episode_ends(user):
    for state, code, reason in (("succeeded", 0, "exit"), ("failed", 3, "exit")):
        _, one = episode(user)
        report(one)
        report(one, state, code, reason)
        _, one = episode(user)
        report(one, state, code, reason)


def episodes_time_out(user):
    _, starting = episode(user)
    _, runs_on = episode(user)
    report(runs_on)
    episode(user, place=False)
    episodes.episodes_time_out(now=timezone.now() + LATER)
    report(starting, "failed", -15, "stopped")


def episodes_cancelled(user):
    starting, _ = episode(user)
    running_one, one = episode(user)
    report(one)
    queued, _ = episode(user, place=False)
    for each in (queued, starting, running_one):
        episodes.episode_cancel(actor=SYSTEM, episode=each)


# --- Preemption (Q6) ---


def preempting(user) -> tuple[TrainingJob, list[Member]]:
    """A job of ml runs an hour on a borrowed card; cv, guaranteed the Fleet's 16 cards,
    waits for all of them: the pass preempts the job."""
    cv = Project.objects.create(slug="cv", name="Vision")
    Membership.objects.create(project=cv, user=user)
    fleet = Fleet.objects.get(pk="gpu-lab")
    quotas_replace(actor=SYSTEM, fleet=fleet, specs=[QuotaSpec("cv", guaranteed=16)])
    record, members = running(user)
    Attempt.objects.filter(training_job=record).update(started_at=timezone.now() - LATER)
    submission.training_job_submit(
        actor=Actor.of_user(user), project="cv", name="owner", command=["true"], cards=8, nodes=2
    )
    allocate(fleet_id=fleet.pk)
    record.refresh_from_db()
    assert record.state == "preempting"
    return record, members


def preempted(user):
    _, [one] = preempting(user)
    report(one, "failed", -15, "stopped")


def preempted_after_it_finished(user):
    _, [one] = preempting(user)
    report(one, "succeeded", 0, "exit")


def preempted_after_it_failed(user):
    _, [one] = preempting(user)
    report(one, "failed", 1, "exit")


def preempted_then_cancelled(user):
    record, [one] = preempting(user)
    cancel(record)
    report(one, "failed", -15, "stopped")


FLOWS = (
    succeeds,
    succeeds_at_once,
    fails_starting,
    fails_running,
    cancelled_queued,
    cancelled_starting,
    cancelled_running,
    gone_back_then_given_up_and_left_over,
    gone_while_starting_and_given_up,
    given_up_then_back_with_it_failed,
    back_with_it_finished,
    back_without_it,
    cancelled_while_unknown,
    abandoned_running,
    abandoned_starting,
    abandoned_unknown,
    gang_past_its_deadline,
    rolled_out_then_stopped,
    rolled_back,
    session_ended,
    episode_ends,
    episodes_time_out,
    episodes_cancelled,
    preempted,
    preempted_after_it_finished,
    preempted_after_it_failed,
    preempted_then_cancelled,
)
# Moves only a cluster Fleet's manager makes, read back by placement.handover: their flows
# are tests/placement/test_cluster_jobs.py's (test_a_managers_states_move_the_job_by_its_table).
BY_A_CLUSTER_MANAGER = {
    ("job", "queued", "running"),
    ("job", "queued", "succeeded"),
    ("job", "queued", "failed"),
    ("job", "running", "queued"),
    ("job", "preempting", "running"),  # requeued by its manager and running again (Q6)
}


class _RolledBack(Exception):
    pass


@contextmanager
def rolled_back():
    """A flow's writes undone once it has run: the next flow finds the two nodes as new."""
    try:
        with transaction.atomic():
            yield
            raise _RolledBack
    except _RolledBack:
        pass


def test_every_move_a_table_allows_is_made_by_some_service(lab, member):
    with recording() as made:
        for flow in FLOWS:
            with rolled_back():
                flow(member)
    allowed = {(lifecycle.name, *pair) for lifecycle in ALL for pair in lifecycle.pairs()}
    never = sorted(allowed - made - BY_A_CLUSTER_MANAGER)
    assert not never, f"moves a table allows that no service made: {never}"


def test_a_move_writes_its_state_reason_and_fields_and_one_event_saying_before_and_after(
    lab, member
):
    """tuneplane.lifecycle.move, read back whole (issue 47: mutmut left the before-reason,
    the fields written and the event's `forced` untested)."""
    record = job(member)
    record.refresh_from_db()
    was_reason = record.reason
    events = AuditEvent.objects.count()
    assert move(
        record,
        JOB_LIFECYCLE,
        "cancelled",
        actor=SYSTEM,
        reason="why",
        fields={"priority": 7},
        after={"extra": 1},
    )
    saved = TrainingJob.objects.get(pk=record.pk)
    assert (saved.state, saved.reason, saved.priority) == ("cancelled", "why", 7)
    [event] = AuditEvent.objects.order_by("-id")[:1]
    assert AuditEvent.objects.count() == events + 1
    assert event.action == "job.cancelled" and event.forced is False
    assert event.before == {"state": "queued", "reason": was_reason}
    assert event.after == {"state": "cancelled", "reason": "why", "extra": 1}
    # Already there with that reason, nothing else asked: nothing written, no event.
    assert not move(saved, JOB_LIFECYCLE, "cancelled", actor=SYSTEM, reason="why")
    assert AuditEvent.objects.count() == events + 1
    # Forced, and the action named: the event says so.
    assert move(
        saved,
        JOB_LIFECYCLE,
        "cancelled",
        actor=SYSTEM,
        reason="again",
        forced=True,
        action="job.forced_test",
    )
    [forced] = AuditEvent.objects.order_by("-id")[:1]
    assert (forced.action, forced.forced, forced.before["reason"]) == (
        "job.forced_test",
        True,
        "why",
    )


def test_a_refused_move_names_its_record():
    with pytest.raises(IllegalMove) as refused:
        JOB_LIFECYCLE.check("cancelled", "running", target=42)
    assert str(refused.value).startswith("job 42: cancelled → running")


def test_a_move_the_lifecycle_refuses_names_the_record_moved_and_writes_nothing(lab, member):
    """move() itself, not only the table's check, names the record it refuses to move."""
    record = job(member)
    assert move(record, JOB_LIFECYCLE, "cancelled", actor=SYSTEM, reason="why")
    events = AuditEvent.objects.count()
    with pytest.raises(IllegalMove) as refused:
        move(record, JOB_LIFECYCLE, "running", actor=SYSTEM)
    assert str(refused.value).startswith(f"job {record.pk}: cancelled → running")
    assert TrainingJob.objects.get(pk=record.pk).state == "cancelled"
    assert AuditEvent.objects.count() == events
