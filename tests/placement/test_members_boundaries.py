"""A member as its node reports it (placement.services.members) on the boundaries a mutant
moved (issue 47): the whole mapping from a start command's report to a member's move, for
every live state and none that has ended (R8, R9, R10, D3); what a report records beside the
move (R5, H4, S1); cards released once, on the cleanup's confirmation (R7); a stop or a
cleanup sent once per member, never to an abandoned one (R10, D3). Each test was seen
failing against the mutant it names."""

from unittest.mock import call, patch

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from nodes.models import NodeCommand
from placement.models import CardHold, Member
from placement.services.allocator import allocate
from placement.services.members import (
    member_release,
    members_clean,
    members_send,
    members_stop,
    reported_as,
    stop_grace,
)
from tests.conftest import SYSTEM
from tests.placement.test_quotas import submit
from tests.placement.test_running_rules import report

LIVE = ("starting", "running", "unknown")
ENDED = ("succeeded", "failed", "lost", "cancelled", "abandoned", "preempted")


@pytest.mark.parametrize("state", LIVE)
@pytest.mark.parametrize(
    ("command_state", "reason", "stop_requested", "moved"),
    [
        ("running", "", False, ("running", "")),
        ("running", "restarting", True, ("running", "restarting")),  # its reason, kept
        ("lost", "abandoned", False, ("abandoned", "abandoned")),  # D3: removed by force
        ("lost", "lost", False, ("lost", "lost")),  # R8: given up past the deadline
        ("lost", "", False, ("failed", "vanished")),  # R8: its node did not know it
        ("lost", "stopped", True, ("failed", "vanished")),  # a lost command is never a stop
        ("succeeded", "", False, ("succeeded", "vanished")),
        ("succeeded", "done", False, ("succeeded", "done")),
        ("succeeded", "", True, ("cancelled", "stopped")),  # R10: asked, no reason given
        ("failed", "oom", False, ("failed", "oom")),
        ("failed", "stopped", False, ("cancelled", "stopped")),
        ("failed", "exit", True, ("failed", "exit")),  # its own end, whatever was asked
        ("pending", "", False, None),  # nothing acknowledged: nothing moves
        ("pending", "", True, None),
    ],
)
def test_R8_R10_D3_a_live_members_report_maps_to_exactly_one_move(
    state, command_state, reason, stop_requested, moved
):
    assert (
        reported_as(
            state,
            command_state=command_state,
            command_reason=reason,
            stop_requested=stop_requested,
        )
        == moved
    )


@pytest.mark.parametrize("state", ENDED)
@pytest.mark.parametrize("command_state", ["running", "succeeded", "failed", "lost"])
def test_R9_a_member_that_has_ended_moves_no_more_whatever_its_node_says(state, command_state):
    assert reported_as(state, command_state=command_state, command_reason="stopped") is None
    assert reported_as(state, command_state=command_state, stop_requested=True) is None


def test_R8_a_report_with_no_reason_and_no_stop_is_read_with_the_defaults():
    assert reported_as("running", command_state="failed") == ("failed", "vanished")
    assert reported_as("running", command_state="succeeded") == ("succeeded", "vanished")


# The database side: cards released once (R7), a stop or cleanup sent once (R10, D3)


@pytest.fixture
def placed(node_fleet, gpu_node, member):
    """A training job's one member, placed on an 8-card node and running."""
    gpu_node(node_fleet)
    job = submit(member, "ml", "train", cards=8)
    allocate(fleet_id=node_fleet.id)
    [one] = Member.objects.filter(attempt__training_job=job)
    report(one)
    one.refresh_from_db()
    return one


def command_of(member: Member) -> NodeCommand:
    return NodeCommand.objects.get(pk=member.command_id)


def test_R7_a_members_cards_are_released_once_on_the_cleanups_confirmation_audited(
    placed, node_fleet
):
    assert CardHold.objects.filter(member=placed).count() == 8
    with patch("placement.services.members.allocate_on_commit") as allocating:
        member_release(placed, command_of(placed), SYSTEM, node_fleet.id)  # not confirmed
        assert CardHold.objects.filter(member=placed).count() == 8 and not allocating.called
        command = command_of(placed)
        command.cleaned_at = timezone.now()
        member_release(placed, command, SYSTEM, lambda: node_fleet.id)
        member_release(placed, command, SYSTEM, node_fleet.id)  # confirmed again: nothing
    assert allocating.call_args_list == [call(node_fleet.id)]
    placed.refresh_from_db()
    assert placed.cleanup == "cleaned" and not CardHold.objects.filter(member=placed).exists()
    assert CardHold.objects.count() == 0
    [event] = AuditEvent.objects.filter(action="member.cleaned")
    assert (event.target_id, event.before, event.after) == (
        str(placed.pk),
        {"cleanup": "pending"},
        {"cleanup": "cleaned", "cards_released": placed.cards},
    )


def test_R7_a_fleet_id_given_as_a_value_is_the_pass_asked_for(placed, node_fleet):
    command = command_of(placed)
    command.cleaned_at = timezone.now()
    with patch("placement.services.members.allocate_on_commit") as allocating:
        member_release(placed, command, SYSTEM, node_fleet.id)
    assert allocating.call_args_list == [call(node_fleet.id)]


def test_R10_a_stop_is_sent_once_with_the_grace_and_stamped_on_the_member(placed):
    before = NodeCommand.objects.count()
    at = timezone.now()
    members_send("stop", [placed], at)
    [stop] = NodeCommand.objects.filter(kind="stop")
    assert stop.node_id == placed.node_id
    assert stop.payload == {"member": placed.command_id, "grace_seconds": stop_grace()}
    assert placed.stop_requested_at == at
    assert Member.objects.get(pk=placed.pk).stop_requested_at == at
    members_send("stop", [placed], at)  # the same member, as its caller still holds it
    members_send("stop", [Member.objects.get(pk=placed.pk)], at)
    assert NodeCommand.objects.count() == before + 1


def test_R10_a_grace_given_is_kept_and_a_cleanup_carries_none(placed):
    members_send("stop", [placed], grace_seconds=5)
    assert NodeCommand.objects.get(kind="stop").payload == {
        "member": placed.command_id,
        "grace_seconds": 5,
    }
    members_send("cleanup", [placed])
    cleanup = NodeCommand.objects.get(kind="cleanup")
    assert cleanup.payload == {"member": placed.command_id}
    placed.refresh_from_db()
    assert placed.cleanup_requested_at is not None and placed.stop_requested_at is not None


def test_D3_an_abandoned_member_is_sent_nothing(placed):
    before = NodeCommand.objects.count()
    placed.state = "abandoned"
    members_send("stop", [placed])
    members_send("cleanup", [placed])
    assert NodeCommand.objects.count() == before
    assert placed.stop_requested_at is None and placed.cleanup_requested_at is None


def test_R7_R10_only_live_members_are_stopped_and_only_ended_ones_cleaned(placed):
    members_clean([placed])  # running: no cleanup yet
    assert not NodeCommand.objects.filter(kind="cleanup").exists()
    members_stop([placed])
    assert NodeCommand.objects.filter(kind="stop").count() == 1
    placed.state = "failed"
    members_stop([placed])  # ended: no stop
    members_clean([placed])
    assert NodeCommand.objects.filter(kind="stop").count() == 1
    assert NodeCommand.objects.filter(kind="cleanup").count() == 1
