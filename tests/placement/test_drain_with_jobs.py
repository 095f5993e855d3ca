"""Drain and removal with work on the node (D1–D3 with DESIGN §7): a draining node is
drained once its last attempt has ended and been cleaned up; removing it before is refused;
a gone node removed by force leaves its members abandoned, audited, the job retried."""

import pytest

from audit.models import AuditEvent
from nodes.models import Node
from nodes.services.commands import Reported, node_command_report
from nodes.services.drains import node_drain
from nodes.services.removal import node_remove
from placement.models import Member, TrainingJob
from tests.conftest import SYSTEM
from tuneplane.errors import Conflict

from .test_reconcile import member_of, started


def test_D1_D2_a_draining_node_is_drained_only_once_its_members_are_cleaned_up(
    two_nodes,
    node_fleet,
    member,
):
    record = started(member, node_fleet)
    running = member_of(record)
    node = node_drain(actor=SYSTEM, node=Node.objects.get(pk=running.node_id), reason="retiring")
    assert node.scheduling_state == "draining"  # nothing is killed (D1)
    with pytest.raises(Conflict) as refused:
        node_remove(actor=SYSTEM, node=node)
    assert refused.value.rule == "D2"
    node_command_report(
        node_id=node.id, reported=Reported(running.command_id, "succeeded", 0, "exit")
    )
    assert Node.objects.get(pk=node.id).scheduling_state == "draining"  # ended, not cleaned
    node_command_report(
        node_id=node.id, reported=Reported(running.command_id, "succeeded", 0, "exit", cleaned=True)
    )
    assert Node.objects.get(pk=node.id).scheduling_state == "drained"
    assert TrainingJob.objects.get(pk=record.pk).state == "succeeded"


def test_D3_a_gone_node_removed_by_force_leaves_its_members_abandoned_and_the_job_retried(
    two_nodes,
    node_fleet,
    member,
):
    record = started(member, node_fleet)
    running = member_of(record)
    Node.objects.filter(pk=running.node_id).update(scheduling_state="gone")
    node_remove(actor=SYSTEM, node=Node.objects.get(pk=running.node_id), force=True)
    assert Member.objects.get(pk=running.pk).state == "abandoned"
    event = AuditEvent.objects.get(action="node_command.abandoned")
    assert event.forced and event.target_id == running.command_id
    assert TrainingJob.objects.get(pk=record.pk).state == "queued"  # another attempt


def test_an_unkillable_member_cordons_its_node_until_it_is_gone(
    two_nodes,
    node_fleet,
    member,
):
    from nodes.models import NodeCordon

    record = started(member, node_fleet)
    stuck = member_of(record)
    node_command_report(
        node_id=stuck.node_id, reported=Reported(stuck.command_id, "running", reason="unkillable")
    )
    cordon = NodeCordon.objects.get(node_id=stuck.node_id)
    assert (cordon.source, cordon.created_by) == ("unkillable", "unkillable")
    assert member_of(record).reason == "unkillable"
    # Its processes finally went and the node cleaned up: the cordon is lifted.
    node_command_report(
        node_id=stuck.node_id,
        reported=Reported(stuck.command_id, "failed", -9, "stopped", cleaned=True),
    )
    assert not NodeCordon.objects.filter(node_id=stuck.node_id).exists()
