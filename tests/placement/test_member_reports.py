"""A member as its node reports it (placement.services.members): a stop the console asked for
ends it ``cancelled``/``stopped`` even when the node gives no reason (R10), and the
confinement the node reports is recorded on it (R5). Issue 47: breaking either passed every
in-process test."""

import pytest

from placement.models import Member, TrainingJob
from placement.services.allocator import allocate
from placement.services.members import reported_as
from tests.placement.test_quotas import submit
from tests.placement.test_running_rules import report

CONFINED = "cgroup v2: cpus 8, memory 68719476736, pids 4096"


@pytest.mark.parametrize(
    ("ended", "reason", "stop_requested", "moved"),
    [
        ("failed", "", True, ("cancelled", "stopped")),  # asked to stop, no reason given
        ("succeeded", "", True, ("cancelled", "stopped")),
        ("failed", "stopped", False, ("cancelled", "stopped")),
        ("failed", "", False, ("failed", "vanished")),  # nobody asked: not a stop
        ("failed", "oom", True, ("failed", "oom")),  # its own end, whatever was asked
        ("failed", "exit", False, ("failed", "exit")),
    ],
)
def test_R10_a_stop_the_console_asked_for_ends_cancelled_even_without_a_reason(
    ended, reason, stop_requested, moved
):
    assert (
        reported_as(
            "running", command_state=ended, command_reason=reason, stop_requested=stop_requested
        )
        == moved
    )


def test_R5_R10_a_members_confinement_is_recorded_and_a_stop_without_reason_cancels(
    node_fleet, gpu_node, member, member_api
):
    gpu_node(node_fleet)
    job = submit(member, "ml", "train", cards=8)
    allocate(fleet_id=node_fleet.id)
    [placed] = Member.objects.filter(attempt__training_job=job)
    report(placed, confinement=CONFINED)
    placed.refresh_from_db()
    assert (placed.state, placed.confinement) == ("running", CONFINED)
    assert member_api.post(f"/api/training-jobs/{job.pk}/cancel").status_code == 200
    report(placed, "failed", exit_code=-15, reason="", cleaned=True)  # the node says no why
    placed.refresh_from_db()
    assert (placed.state, placed.reason, placed.cleanup) == ("cancelled", "stopped", "cleaned")
    assert placed.confinement == CONFINED
    assert TrainingJob.objects.get(pk=job.pk).state == "cancelled"
