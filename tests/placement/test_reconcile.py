"""A member's node going away and coming back, gangs that never come together, a member
failing (R3, R8, R9), in process on the real database. The node's reports go through the
same service the gateway calls (nodes.services.commands); the real agent and stream are
tests/e2e/test_jobs.py."""

from datetime import timedelta

from django.utils import timezone

from audit.models import AuditEvent
from nodes.models import Node, NodeCommand
from nodes.services.commands import Reported, node_command_report, node_commands_reconcile
from placement.models import Attempt, CardHold, Member, TrainingJob
from placement.services.allocator import allocate
from placement.services.reconcile import members_reconcile

from .test_allocator import job


def started(member_user, fleet, **fields):
    """A job allocated and every member reported running."""
    record = job(member_user, cards=8, **fields)
    allocate(fleet_id=fleet.id)
    for member in Member.objects.filter(attempt__training_job=record):
        node_command_report(node_id=member.node_id, reported=Reported(member.command_id, "running"))
    return record


def member_of(record, number=1, rank=0) -> Member:
    return Member.objects.get(attempt__training_job=record, attempt__number=number, rank=rank)


def go_gone(node_id: str, silent_for: int) -> None:
    Node.objects.filter(pk=node_id).update(
        scheduling_state="gone", last_seen_at=timezone.now() - timedelta(seconds=silent_for)
    )


def test_R8_a_gone_nodes_member_is_unknown_and_back_before_the_deadline_it_just_continues(
    two_nodes, node_fleet, member, settings
):
    record = started(member, node_fleet)
    node_id = member_of(record).node_id
    go_gone(node_id, settings.TUNEPLANE_QUIET_TRAIN + 10)
    members_reconcile()
    assert (member_of(record).state, member_of(record).reason) == ("unknown", "node_gone")
    assert TrainingJob.objects.get(pk=record.pk).state == "running"  # nothing retried yet
    # Back before the deadline, still running it: no retry, no kill.
    Node.objects.filter(pk=node_id).update(scheduling_state="schedulable")
    node_commands_reconcile(
        node_id=node_id, reported=[Reported(member_of(record).command_id, "running")]
    )
    members_reconcile()
    assert member_of(record).state == "running"
    assert Attempt.objects.filter(training_job=record).count() == 1
    assert not NodeCommand.objects.filter(kind__in=("stop", "cleanup")).exists()


def test_R8_back_before_the_deadline_reporting_it_finished_or_not_knowing_it(
    two_nodes, node_fleet, member, settings
):
    finished, forgotten = started(member, node_fleet), started(member, node_fleet)
    for record in (finished, forgotten):
        go_gone(member_of(record).node_id, settings.TUNEPLANE_QUIET_TRAIN + 10)
    members_reconcile()
    done = member_of(finished)
    node_commands_reconcile(
        node_id=done.node_id, reported=[Reported(done.command_id, "succeeded", 0, "exit")]
    )
    assert TrainingJob.objects.get(pk=finished.pk).state == "succeeded"
    lost = member_of(forgotten)
    node_commands_reconcile(node_id=lost.node_id, reported=[])  # it does not know it
    assert (member_of(forgotten).state, member_of(forgotten).reason) == ("failed", "vanished")
    # vanished is the machine's doing: the job gets another attempt (R9).
    assert TrainingJob.objects.get(pk=forgotten.pk).state == "queued"


def test_R8_R9_past_the_deadline_the_attempt_is_lost_retried_elsewhere_and_the_leftover_stopped(
    two_nodes, node_fleet, member, settings
):
    settings.TUNEPLANE_INFRA_BACKOFF_FIRST = 0  # H2's backoff: tests/placement/test_hardware_faults
    record = started(member, node_fleet)
    gone = member_of(record)
    go_gone(
        gone.node_id, settings.TUNEPLANE_QUIET_TRAIN + settings.TUNEPLANE_RECONCILE_DEADLINE - 5
    )
    members_reconcile()
    assert member_of(record).state == "unknown"  # not past the deadline yet
    go_gone(
        gone.node_id, settings.TUNEPLANE_QUIET_TRAIN + settings.TUNEPLANE_RECONCILE_DEADLINE + 5
    )
    members_reconcile()
    assert (member_of(record).state, Attempt.objects.get(training_job=record).state) == (
        "lost",
        "lost",
    )
    job_now = TrainingJob.objects.get(pk=record.pk)
    assert (job_now.state, job_now.reason) == ("queued", "retrying after lost")
    # Its cards stay held on the gone node until that node confirms the cleanup (R7).
    assert CardHold.objects.filter(node_id=gone.node_id).count() == 8
    allocate(fleet_id=node_fleet.id)
    retry = member_of(record, number=2)
    assert retry.node_id != gone.node_id
    # The old node comes back still running the given-up member: recorded, never counted,
    # stopped by the cleanup waiting for it.
    Node.objects.filter(pk=gone.node_id).update(scheduling_state="schedulable")
    pending = node_commands_reconcile(
        node_id=gone.node_id, reported=[Reported(gone.command_id, "running")]
    )
    assert [c.kind for c in pending] == ["cleanup"]
    assert member_of(record).state == "lost"
    assert AuditEvent.objects.filter(
        action="member.leftover_running", target_id=str(gone.pk)
    ).exists()
    node_command_report(
        node_id=gone.node_id,
        reported=Reported(gone.command_id, "failed", -9, "stopped", cleaned=True),
    )
    assert (
        member_of(record).state == "lost"
        and not CardHold.objects.filter(node_id=gone.node_id).exists()
    )
    assert TrainingJob.objects.get(pk=record.pk).state == "starting"  # the retry's


def test_R3_a_gang_not_all_running_by_its_deadline_fails_stops_its_members_and_backs_off(
    two_nodes, node_fleet, member
):
    gang = job(member, cards=8, nodes=2, gang_deadline_seconds=30)
    allocate(fleet_id=node_fleet.id)
    first = member_of(gang, rank=0)
    node_command_report(node_id=first.node_id, reported=Reported(first.command_id, "running"))
    members_reconcile()
    assert Attempt.objects.get(training_job=gang).state == "starting"  # within the deadline
    Attempt.objects.filter(training_job=gang).update(
        created_at=timezone.now() - timedelta(seconds=31)
    )
    members_reconcile()
    attempt = Attempt.objects.get(training_job=gang)
    assert (attempt.state, attempt.reason) == ("failed", "gang_deadline")
    stops = NodeCommand.objects.filter(kind="stop")
    assert {c.payload["member"] for c in stops} == {
        member_of(gang, rank=0).command_id,
        member_of(gang, rank=1).command_id,
    }
    retried = TrainingJob.objects.get(pk=gang.pk)
    assert retried.state == "queued" and retried.not_before > timezone.now()
    for rank in (0, 1):  # cleaned up: the cards are free, but the backoff holds the retry
        m = member_of(gang, rank=rank)
        node_command_report(
            node_id=m.node_id, reported=Reported(m.command_id, "failed", -9, "stopped", True)
        )
    assert not CardHold.objects.exists()
    assert allocate(fleet_id=node_fleet.id)["allocated"] == 0


def test_R3_one_member_failing_fails_the_attempt_and_stops_the_others(
    two_nodes, node_fleet, member
):
    gang = started(member, node_fleet, nodes=2)
    failing = member_of(gang, rank=1)
    node_command_report(
        node_id=failing.node_id, reported=Reported(failing.command_id, "failed", 1, "exit")
    )
    attempt = Attempt.objects.get(training_job=gang)
    assert (attempt.state, attempt.reason) == ("failed", "exit")
    stop = NodeCommand.objects.get(kind="stop")
    assert stop.payload["member"] == member_of(gang, rank=0).command_id
    assert TrainingJob.objects.get(pk=gang.pk).state == "failed"  # R9: an exit is not retried


def test_R10_a_cancelled_job_is_never_retried_however_its_attempt_ends(
    two_nodes,
    node_fleet,
    member,
):
    from audit.services import Actor
    from placement.services.runs import job_cancel

    record = started(member, node_fleet)
    job_cancel(actor=Actor.of_user(member), job=record)
    running = member_of(record)
    # The stop never got there: the node dropped it (vanished is the machine's doing).
    node_commands_reconcile(node_id=running.node_id, reported=[])
    job_now = TrainingJob.objects.get(pk=record.pk)
    assert (job_now.state, job_now.reason) == ("cancelled", "cancelled")
    assert allocate(fleet_id=node_fleet.id)["allocated"] == 0
    assert Attempt.objects.filter(training_job=record).count() == 1


def test_R7_a_cleanup_answered_for_a_member_the_node_knows_does_not_release_its_cards(
    two_nodes,
    node_fleet,
    member,
):
    record = started(member, node_fleet)
    ended = member_of(record)
    node_command_report(
        node_id=ended.node_id, reported=Reported(ended.command_id, "succeeded", 0, "exit")
    )
    cleanup = NodeCommand.objects.get(kind="cleanup")
    # The node acknowledged the cleanup but has not cleaned (a process outlived SIGKILL).
    node_command_report(node_id=ended.node_id, reported=Reported(cleanup.id, "succeeded", 0))
    assert CardHold.objects.filter(member=ended).count() == 8
    # A node that did not know the member cleaned it by its id: nothing is left there.
    other = started(member, node_fleet)
    lost = member_of(other)
    node_commands_reconcile(node_id=lost.node_id, reported=[])  # its state file is gone
    gone_cleanup = NodeCommand.objects.get(kind="cleanup", payload__member=lost.command_id)
    node_command_report(
        node_id=lost.node_id, reported=Reported(gone_cleanup.id, "succeeded", 0, "unknown_member")
    )
    assert not CardHold.objects.filter(member=lost).exists()
