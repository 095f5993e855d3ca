"""Drains carry who, why and until when (D1): a required reason, an optional deadline that
kills nothing, drain overdue marked once, a Fleet's machines drained in one step, and the
Fleet page's drain progress."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from nodes.choices import CommandState, SchedulingState
from nodes.models import Node, NodeCommand
from nodes.services.commands import Reported, node_command_create, node_command_report
from nodes.services.drains import drains_overdue_mark, fleet_nodes_drain, node_drain
from nodes.services.join import node_join
from tests.conftest import H100_INVENTORY, SYSTEM, make_csr
from tests.fleets.test_concurrency import race
from tuneplane.errors import Conflict, ValidationFailed

RUN = {"argv": ["sleep", "600"]}
SOON = "2999-01-01T00:00:00Z"


@pytest.fixture
def joined(mint):
    def make(fleet, hostname="gpu-01"):
        node = node_join(
            token=mint(fleet)[1],
            fleet_id=fleet.id,
            csr=make_csr()[1],
            inventory=H100_INVENTORY,
            hostname=hostname,
        ).node
        Node.objects.filter(pk=node.pk).update(scheduling_state=SchedulingState.SCHEDULABLE)
        return Node.objects.get(pk=node.pk)

    return make


def running_on(node) -> NodeCommand:
    command = node_command_create(actor=SYSTEM, node=node, kind="run", payload=RUN)
    node_command_report(node_id=node.id, reported=Reported(command.id, "running"))
    return command


def test_D1_an_operator_drain_needs_a_reason_and_a_deadline_ahead(admin_api, node_fleet, joined):
    node = joined(node_fleet)
    for body, field in (({}, "reason"), ({"reason": " "}, "reason")):
        refused = admin_api.post(f"/api/nodes/{node.id}/drain", body)
        assert refused.status_code == 400 and field in refused.content.decode()
    past = {"reason": "leaving", "deadline": "2000-01-01T00:00:00Z"}
    refused = admin_api.post(f"/api/nodes/{node.id}/drain", past)
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "deadline"
    with pytest.raises(ValidationFailed):
        node_drain(actor=SYSTEM, node=node, reason="")
    assert Node.objects.get(pk=node.pk).scheduling_state == SchedulingState.SCHEDULABLE
    assert not AuditEvent.objects.filter(target_id=node.id, action__startswith="node.drain")


def test_D1_the_drain_shows_who_why_until_when_and_the_work_left(admin_api, node_fleet, joined):
    node = joined(node_fleet)
    running_on(node)
    body = admin_api.post(
        f"/api/nodes/{node.id}/drain", {"reason": "rack 4 power work", "deadline": SOON}
    ).json()
    drain = body["scheduling"]["drain"]
    assert body["scheduling"]["state"] == "draining"
    assert drain["reason"] == "rack 4 power work" and drain["by"] == admin_api.user.username
    assert drain["deadline"].startswith("2999-01-01") and drain["overdue"] is False
    assert drain["work_left"] == {"run": 1}
    event = AuditEvent.objects.get(target_id=node.id, action="node.draining")
    assert event.after["reason"] == "rack 4 power work" and event.actor_label == drain["by"]


def test_D1_past_the_deadline_nothing_is_killed_and_overdue_is_marked_once(
    admin_api, node_fleet, joined
):
    node = joined(node_fleet)
    command = running_on(node)
    node_drain(actor=SYSTEM, node=node, reason="leaving", deadline=timezone.now() + timedelta(1))
    assert drains_overdue_mark() == 0  # the deadline is ahead
    Node.objects.filter(pk=node.pk).update(drain_deadline=timezone.now() - timedelta(seconds=1))
    assert drains_overdue_mark() == 1
    assert drains_overdue_mark() == 0  # once
    command.refresh_from_db()
    assert command.state == CommandState.RUNNING  # D1: nothing stopped
    assert Node.objects.get(pk=node.pk).scheduling_state == SchedulingState.DRAINING
    event = AuditEvent.objects.get(action="node.drain_overdue")
    assert event.target_id == node.id and event.after["still_running"] == {"run": [command.id]}
    drain = admin_api.get(f"/api/nodes/{node.id}").json()["scheduling"]["drain"]
    assert drain["overdue"] is True and drain["work_left"] == {"run": 1}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_D1_two_sweeps_at_once_mark_an_overdue_drain_once(make_fleet, joined):
    fleet = make_fleet("lab", kind="node", capabilities=["train"])
    nodes = [joined(fleet, f"gpu-{i}") for i in range(3)]
    for node in nodes:
        running_on(node)
        node_drain(actor=SYSTEM, node=node, reason="leaving")
    Node.objects.update(drain_deadline=timezone.now() - timedelta(seconds=1))
    assert sum(race(lambda _: drains_overdue_mark(), count=4)) == 3
    assert AuditEvent.objects.filter(action="node.drain_overdue").count() == 3


def test_D1_a_fleets_machines_drain_in_one_step_with_one_reason(
    admin_api, member_api, node_fleet, joined
):
    busy, idle = joined(node_fleet, "gpu-01"), joined(node_fleet, "gpu-02")
    running_on(busy)
    assert member_api.post("/api/fleets/gpu-lab/drain", {"reason": "x"}).status_code == 403
    assert admin_api.post("/api/fleets/gpu-lab/drain", {}).status_code == 400
    body = admin_api.post("/api/fleets/gpu-lab/drain", {"reason": "decommission"}).json()
    states = {node["id"]: node["scheduling"]["state"] for node in body["nodes"]}
    assert body["fleet"] == "gpu-lab"
    assert states == {busy.id: "draining", idle.id: "drained"}
    events = AuditEvent.objects.filter(action__in=["node.draining", "node.drained"])
    assert sorted(e.target_id for e in events) == sorted([busy.id, idle.id])
    assert {e.after["reason"] for e in events} == {"decommission"}
    again = admin_api.post("/api/fleets/gpu-lab/drain", {"reason": "other words"})
    assert again.status_code == 200 and events.count() == 2  # draining ones are left as they are


def test_F8_a_fleet_drain_hides_an_invisible_fleet_and_refuses_a_cluster_fleet(
    outsider_api, admin_api, make_fleet, project
):
    make_fleet("hidden", kind="node", visibility="project", project=project)
    missing = outsider_api.post("/api/fleets/no-such/drain", {"reason": "x"})
    hidden = outsider_api.post("/api/fleets/hidden/drain", {"reason": "x"})
    assert hidden.status_code == missing.status_code == 404
    assert hidden.content.decode().replace("hidden", "ID") == missing.content.decode().replace(
        "no-such", "ID"
    )
    slurm = make_fleet("hpc", kind="slurm", config={})
    refused = admin_api.post("/api/fleets/hpc/drain", {"reason": "x"})
    assert refused.status_code == 409 and refused.json()["error"]["rule"] == "D1"
    with pytest.raises(Conflict):
        fleet_nodes_drain(actor=SYSTEM, fleet=slurm, reason="x")


def test_D1_the_fleet_page_shows_each_drain_and_the_fleets_progress(
    client, admin_user, node_fleet, joined
):
    busy = joined(node_fleet, "gpu-01")
    joined(node_fleet, "gpu-02")
    running_on(busy)
    fleet_nodes_drain(actor=SYSTEM, fleet=node_fleet, reason="decommission")
    Node.objects.filter(pk=busy.pk).update(drain_deadline=timezone.now() - timedelta(seconds=1))
    drains_overdue_mark()
    client.force_login(admin_user)
    page = client.get("/admin/fleets/fleet/gpu-lab/change/").content.decode()
    progress = re.search(r'<p id="drain-progress">(.*?)</p>', page, re.S).group(1)
    assert "1 of 2 machine(s) drained" in progress and "1 drain overdue" in progress
    shown = " ".join(progress.split())
    assert "still to finish on them: 1 command run through the node API" in shown
    busy_row = re.search(rf'data-node="{busy.id}">\s*<td>gpu-01</td>.*?</tr>', page, re.S)
    assert "decommission" in busy_row.group(0) and "drain overdue" in busy_row.group(0)


def test_D1_the_admin_drains_with_a_reason_and_a_fleets_machines_in_one_action(
    client, admin_user, node_fleet, joined
):
    node = joined(node_fleet)
    client.force_login(admin_user)
    asked = client.post(
        "/admin/nodes/node/", {"action": "drain", "_selected_action": [node.pk]}
    ).content.decode()
    assert 'name="reason"' in asked and 'name="deadline"' in asked
    refused = client.post(
        "/admin/nodes/node/",
        {"action": "drain", "_selected_action": [node.pk], "apply": "1", "reason": ""},
    )
    assert refused.status_code == 200 and "This field is required" in refused.content.decode()
    assert Node.objects.get(pk=node.pk).scheduling_state == SchedulingState.SCHEDULABLE
    client.post(
        "/admin/fleets/fleet/",
        {
            "action": "drain_machines",
            "_selected_action": ["gpu-lab"],
            "apply": "1",
            "reason": "new racks",
        },
    )
    node.refresh_from_db()
    assert (node.scheduling_state, node.drain_reason) == (SchedulingState.DRAINED, "new racks")
