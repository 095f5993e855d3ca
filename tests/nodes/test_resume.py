"""A drain undone (D1, issue 49): a draining or drained node resumed takes work again, audited
(Slurm's RESUME); uncordon on it names resume instead of doing nothing; every scheduling-state
move a service makes is one its lifecycle table allows; a node that went silent while
draining is still leaving when it answers again."""

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from nodes.choices import NODE_LIFECYCLE, CommandState, SchedulingState
from nodes.models import Node, NodeCommand
from nodes.selectors import nodes_placeable
from nodes.services.commands import Reported, node_command_create, node_command_report
from nodes.services.control import node_report_inventory
from nodes.services.cordons import node_cordon, node_uncordon
from nodes.services.drains import node_drain, node_resume
from nodes.services.join import node_join
from nodes.services.liveness import GONE_FROM
from nodes.services.removal import node_remove
from nodes.services.sessions import REPORT_REQUIRED
from tests.conftest import H100_INVENTORY, SYSTEM, make_csr
from tuneplane.errors import Conflict
from tuneplane.lifecycle import IllegalMove

RUN = {"argv": ["sleep", "600"]}


@pytest.fixture
def live(mint, node_fleet):
    """A node that takes work now: schedulable, a live lease, a fresh inventory (L1)."""

    def make(hostname="gpu-01"):
        node = node_join(
            token=mint(node_fleet)[1],
            fleet_id=node_fleet.id,
            csr=make_csr()[1],
            inventory=H100_INVENTORY,
            hostname=hostname,
        ).node
        now = timezone.now()
        Node.objects.filter(pk=node.pk).update(
            scheduling_state=SchedulingState.SCHEDULABLE,
            lease_expires_at=now + timedelta(minutes=5),
            inventory_observed_at=now,
            last_seen_at=now,
        )
        return Node.objects.get(pk=node.pk)

    return make


def running_on(node) -> NodeCommand:
    command = node_command_create(actor=SYSTEM, node=node, kind="run", payload=RUN)
    node_command_report(node_id=node.id, reported=Reported(command.id, "running"))
    return command


def placeable(node) -> bool:
    return nodes_placeable([node.fleet_id]).filter(pk=node.pk).exists()


def test_D1_a_draining_node_resumed_takes_work_again_and_what_runs_runs_on(
    admin_api, node_fleet, live
):
    node = live()
    command = running_on(node)
    drain = {"reason": "rack 4", "deadline": "2999-01-01T00:00:00Z"}
    admin_api.post(f"/api/nodes/{node.id}/drain", drain)
    assert not placeable(node)
    body = admin_api.post(f"/api/nodes/{node.id}/resume").json()
    assert body["scheduling"]["state"] == "schedulable" and body["scheduling"]["drain"] is None
    assert placeable(node)
    command.refresh_from_db()
    assert command.state == CommandState.RUNNING  # nothing stopped, nothing restarted
    event = AuditEvent.objects.get(target_id=node.id, action="node.resumed")
    assert event.before["scheduling_state"] == "draining" and event.before["drain"]["reason"] == (
        "rack 4"
    )
    assert event.after == {"scheduling_state": "schedulable", "drain": None}
    assert event.actor_label == admin_api.user.username
    # Its work finishing later does not drain it again.
    node_command_report(node_id=node.id, reported=Reported(command.id, "succeeded", 0))
    assert Node.objects.get(pk=node.pk).scheduling_state == SchedulingState.SCHEDULABLE


def test_D1_a_drained_node_resumed_with_its_overdue_mark_gone_and_its_cordon_kept(live):
    node = live()
    node_cordon(actor=SYSTEM, node=node, reason="bad DIMM")
    node_drain(actor=SYSTEM, node=node, reason="leaving")
    Node.objects.filter(pk=node.pk).update(drain_overdue_at=timezone.now())
    resumed = node_resume(actor=SYSTEM, node=node)
    stored = Node.objects.get(pk=node.pk)
    assert resumed.scheduling_state == stored.scheduling_state == SchedulingState.SCHEDULABLE
    assert stored.drain_reason == "" and stored.drain_started_at is None
    assert stored.drain_overdue_at is None
    assert [c.reason for c in stored.cordons.all()] == ["bad DIMM"]  # a cordon is its own
    assert not placeable(node)
    node_uncordon(actor=SYSTEM, node=node)
    assert placeable(node)


def test_D1_resume_of_a_node_without_a_drain_changes_nothing_and_a_removed_one_is_refused(
    admin_api, live
):
    node = live()
    assert admin_api.post(f"/api/nodes/{node.id}/resume").status_code == 200
    assert not AuditEvent.objects.filter(action="node.resumed").exists()
    node_drain(actor=SYSTEM, node=node, reason="leaving")
    node_resume(actor=SYSTEM, node=node)
    node_resume(actor=SYSTEM, node=node)  # twice: once
    assert AuditEvent.objects.filter(action="node.resumed").count() == 1
    node_drain(actor=SYSTEM, node=node, reason="leaving for good")
    node_remove(actor=SYSTEM, node=node)
    refused = admin_api.post(f"/api/nodes/{node.id}/resume")
    assert refused.status_code == 409 and refused.json()["error"]["rule"] == "D4"
    assert Node.objects.get(pk=node.pk).scheduling_state == SchedulingState.REMOVED


def test_D1_resume_is_an_administrators_verb_and_an_invisible_node_is_not_found(
    member_api, admin_api, live
):
    node = live()
    node_drain(actor=SYSTEM, node=node, reason="leaving")
    assert member_api.post(f"/api/nodes/{node.id}/resume").status_code == 403
    assert admin_api.post("/api/nodes/n-nope/resume").status_code == 404
    assert Node.objects.get(pk=node.pk).scheduling_state == SchedulingState.DRAINED


@pytest.mark.parametrize("busy", [True, False], ids=["draining", "drained"])
def test_D1_uncordon_on_a_draining_node_is_a_409_naming_resume(admin_api, live, busy):
    node = live()
    if busy:
        running_on(node)
    node_drain(actor=SYSTEM, node=node, reason="leaving")
    refused = admin_api.post(f"/api/nodes/{node.id}/uncordon")
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "node_draining" and "resume" in error["message"]
    assert ("draining" if busy else "drained") in error["message"]
    with pytest.raises(Conflict):
        node_uncordon(actor=SYSTEM, node=node)
    # With an operator's cordon as well, uncordon lifts it; the drain stays.
    node_cordon(actor=SYSTEM, node=node, reason="bad DIMM")
    body = admin_api.post(f"/api/nodes/{node.id}/uncordon").json()
    assert body["scheduling"]["cordons"] == [] and body["scheduling"]["drain"]["reason"] == (
        "leaving"
    )


def test_D1_the_admin_resumes_selected_nodes(client, admin_user, live):
    node = live()
    node_drain(actor=SYSTEM, node=node, reason="leaving")
    client.force_login(admin_user)
    client.post(
        "/admin/nodes/node/", {"action": "resume", "_selected_action": [node.pk]}, follow=True
    )
    assert Node.objects.get(pk=node.pk).scheduling_state == SchedulingState.SCHEDULABLE
    assert AuditEvent.objects.get(action="node.resumed").actor_label == admin_user.username


def test_D1_a_node_silent_while_draining_is_still_leaving_when_it_answers_again(live):
    node = live()
    command = running_on(node)
    node_drain(actor=SYSTEM, node=node, reason="leaving")
    Node.objects.filter(pk=node.pk).update(scheduling_state=SchedulingState.GONE)
    node_report_inventory(node_id=node.id, inventory=H100_INVENTORY)
    assert Node.objects.get(pk=node.pk).scheduling_state == SchedulingState.DRAINING
    node_command_report(node_id=node.id, reported=Reported(command.id, "succeeded", 0))
    Node.objects.filter(pk=node.pk).update(scheduling_state=SchedulingState.GONE)
    node_report_inventory(node_id=node.id, inventory=H100_INVENTORY)
    assert Node.objects.get(pk=node.pk).scheduling_state == SchedulingState.DRAINED
    node_resume(actor=SYSTEM, node=node)
    Node.objects.filter(pk=node.pk).update(scheduling_state=SchedulingState.GONE)
    node_report_inventory(node_id=node.id, inventory=H100_INVENTORY)
    assert Node.objects.get(pk=node.pk).scheduling_state == SchedulingState.SCHEDULABLE


def test_the_node_lifecycle_table_is_the_moves_the_services_make():
    """The set-based writers (the liveness sweep's gone, a report's way back) move what the
    table lets move; removed is the end; resume leads out of draining and drained."""
    gone_from = {s for s in NODE_LIFECYCLE.states() if NODE_LIFECYCLE.allows(s, "gone")}
    assert gone_from == set(GONE_FROM)
    assert all(NODE_LIFECYCLE.allows(s, "schedulable") for s in REPORT_REQUIRED)
    assert all(NODE_LIFECYCLE.allows(s, "schedulable") for s in ("draining", "drained"))
    assert {s for s in NODE_LIFECYCLE.states() if NODE_LIFECYCLE.final(s)} == {"removed"}
    assert {s for s in NODE_LIFECYCLE.states() if NODE_LIFECYCLE.allows(s, "removed")} == {
        "drained",
        "gone",
    }
    with pytest.raises(IllegalMove):
        NODE_LIFECYCLE.check("schedulable", "removed")


def test_a_move_the_node_table_does_not_allow_is_refused_before_anything_is_written(live):
    from nodes.services.drains import node_state_set

    node = live()
    with pytest.raises(IllegalMove):
        node_state_set(node, SchedulingState.REMOVED, SYSTEM)
    assert Node.objects.get(pk=node.pk).scheduling_state == SchedulingState.SCHEDULABLE
    assert not AuditEvent.objects.filter(target_id=node.id, action="node.removed").exists()
