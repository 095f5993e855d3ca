"""Cordons (L6), drain (D1) and removal (D2–D4), through the services and the API."""

import pytest

from audit.models import AuditEvent
from nodes.choices import CommandState, CordonSource, SchedulingState
from nodes.models import ControlSession, Node, NodeCordon, NodeCredential
from nodes.services.commands import Reported, node_command_create, node_command_report
from nodes.services.cordons import node_cordon, node_observe_storage_root
from nodes.services.drains import node_drain
from nodes.services.join import node_join
from nodes.services.sessions import session_open
from tests.conftest import H100_INVENTORY, SYSTEM, make_csr

RUN = {"argv": ["sleep", "600"]}


@pytest.fixture
def join(mint):
    def joined(fleet):
        return node_join(
            token=mint(fleet)[1], fleet_id=fleet.id, csr=make_csr()[1], inventory=H100_INVENTORY
        )

    return joined


@pytest.fixture
def node(node_fleet, join):
    node = join(node_fleet).node
    Node.objects.filter(pk=node.pk).update(scheduling_state=SchedulingState.SCHEDULABLE)
    return Node.objects.get(pk=node.pk)


def cordons(node):
    return dict(NodeCordon.objects.filter(node=node).values_list("source", "reason"))


def test_L6_storage_lost_cordons_and_its_return_lifts_only_the_storage_cordon(node):
    node_cordon(actor=SYSTEM, node=node, reason="replacing a fan")
    assert node_observe_storage_root(node_id=node.id, visible=False) is True
    assert cordons(node) == {"operator": "replacing a fan", "storage": "storage root not visible"}
    assert node_observe_storage_root(node_id=node.id, visible=False) is False  # once
    assert node_observe_storage_root(node_id=node.id, visible=True) is True
    assert cordons(node) == {"operator": "replacing a fan"}
    storage_events = AuditEvent.objects.filter(target_id=node.id, actor_label="storage")
    assert list(storage_events.order_by("id").values_list("action", flat=True)) == [
        "node.cordoned",
        "node.uncordoned",
    ]


def test_L6_an_object_pull_fleet_has_no_storage_root_to_lose(make_fleet, join):
    fleet = make_fleet("pull", kind="node", delivery="object-pull", capabilities=["train"])
    node = join(fleet).node
    assert node_observe_storage_root(node_id=node.id, visible=False) is False
    assert cordons(node) == {}


def test_L6_an_inventory_report_without_the_storage_root_cordons(node):
    from nodes.services.control import node_report_inventory

    node_report_inventory(
        node_id=node.id, inventory={**H100_INVENTORY, "storage_root_visible": False}
    )
    assert cordons(node) == {"storage": "storage root not visible"}


def test_cordon_needs_a_reason_and_uncordon_lifts_only_the_operators(admin_api, node):
    refused = admin_api.post(f"/api/nodes/{node.id}/cordon", {"reason": "  "})
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "reason"
    missing = admin_api.post(f"/api/nodes/{node.id}/cordon", {})
    assert missing.status_code == 400 and "reason" in missing.content.decode()
    body = admin_api.post(f"/api/nodes/{node.id}/cordon", {"reason": "bad DIMM"}).json()
    assert body["scheduling"]["state"] == "cordoned"
    assert body["scheduling"]["cordons"][0]["source"] == "operator"
    assert body["scheduling"]["cordons"][0]["reason"] == "bad DIMM"
    node_observe_storage_root(node_id=node.id, visible=False)
    body = admin_api.post(f"/api/nodes/{node.id}/uncordon").json()
    assert [c["source"] for c in body["scheduling"]["cordons"]] == ["storage"]
    assert body["scheduling"]["state"] == "cordoned"


def test_node_verbs_are_admin_only_and_invisible_nodes_are_not_found(member_api, admin_api, node):
    for verb in ("cordon", "uncordon", "drain", "commands"):
        assert member_api.post(f"/api/nodes/{node.id}/{verb}", {"reason": "x"}).status_code == 403
        assert admin_api.post(f"/api/nodes/n-nope/{verb}", {"reason": "x"}).status_code == 404
    assert member_api.delete(f"/api/nodes/{node.id}").status_code == 403


def test_D1_drain_waits_for_running_work_and_kills_nothing(node):
    running = node_command_create(actor=SYSTEM, node=node, kind="run", payload=RUN)
    node_command_report(node_id=node.id, reported=Reported(running.id, "running"))
    drained = node_drain(actor=SYSTEM, node=node, reason="leaving the rack")
    assert drained.scheduling_state == SchedulingState.DRAINING
    running.refresh_from_db()
    assert running.state == CommandState.RUNNING  # nothing stopped
    node_command_report(node_id=node.id, reported=Reported(running.id, "succeeded", 0))
    assert Node.objects.get(pk=node.pk).scheduling_state == SchedulingState.DRAINED
    assert AuditEvent.objects.filter(target_id=node.id, action="node.drained").count() == 1


def test_D2_removing_an_undrained_node_is_refused(admin_api, node):
    for path in (f"/api/nodes/{node.id}", f"/api/nodes/{node.id}?force=true"):
        response = admin_api.delete(path)
        assert response.status_code == 409
        error = response.json()["error"]
        assert error["rule"] == "D2" and "drain first" in error["message"]
    assert Node.objects.get(pk=node.pk).scheduling_state == SchedulingState.SCHEDULABLE


def test_D4_removing_a_drained_node_kills_its_credential_and_session(admin_api, node, join):
    serial = NodeCredential.objects.get(node=node).serial
    session_open(node_id=node.id, serial=serial, gateway="test")
    assert (
        admin_api.post(f"/api/nodes/{node.id}/drain", {"reason": "leaving the rack"}).json()[
            "scheduling"
        ]["state"]
        == "drained"
    )
    body = admin_api.delete(f"/api/nodes/{node.id}").json()
    assert body["scheduling"]["state"] == "removed"
    assert not NodeCredential.objects.filter(node=node, revoked_at__isnull=True).exists()
    assert not ControlSession.objects.filter(node=node, closed_at__isnull=True).exists()
    event = AuditEvent.objects.get(action="node.removed")
    assert event.forced is False and event.after["credentials_revoked"] == 1


def test_D3_a_gone_node_needs_force_and_its_removal_lists_what_it_leaves(admin_api, node):
    running = node_command_create(actor=SYSTEM, node=node, kind="run", payload=RUN)
    node_command_report(node_id=node.id, reported=Reported(running.id, "running"))
    Node.objects.filter(pk=node.pk).update(scheduling_state=SchedulingState.GONE)
    refused = admin_api.delete(f"/api/nodes/{node.id}")
    assert refused.status_code == 409 and refused.json()["error"]["rule"] == "D3"
    assert refused.json()["error"]["left_behind"] == [running.id]
    assert admin_api.delete(f"/api/nodes/{node.id}?force=maybe").status_code == 400
    assert admin_api.delete(f"/api/nodes/{node.id}?force=no").status_code == 409
    assert admin_api.delete(f"/api/nodes/{node.id}?force=yes").status_code == 200
    event = AuditEvent.objects.get(action="node.removed")
    assert event.forced is True and event.after["left_behind"] == [running.id]


def test_D4_a_removed_node_takes_no_commands_or_verbs(admin_api, node):
    Node.objects.filter(pk=node.pk).update(scheduling_state=SchedulingState.REMOVED)
    response = admin_api.post(f"/api/nodes/{node.id}/commands", {"kind": "run", "payload": RUN})
    assert response.status_code == 409 and response.json()["error"]["rule"] == "D4"
    assert admin_api.post(f"/api/nodes/{node.id}/cordon", {"reason": "x"}).status_code == 409


def test_commands_api_creates_and_lists(admin_api, node):
    response = admin_api.post(f"/api/nodes/{node.id}/commands", {"kind": "run", "payload": RUN})
    assert response.status_code == 201, response.content
    made = response.json()
    assert made["state"] == "pending" and made["node"] == node.id
    listed = admin_api.get(f"/api/nodes/{node.id}/commands").json()
    assert [c["id"] for c in listed["results"]] == [made["id"]]
    bad = admin_api.post(f"/api/nodes/{node.id}/commands", {"kind": "reboot", "payload": RUN})
    assert bad.status_code == 400 and "kind" in bad.content.decode()


def test_L6_the_cordon_sweep_repairs_what_the_gateway_missed(node, join, node_fleet):
    from nodes.services.cordons import storage_cordon_sweep

    other = join(node_fleet).node
    node_cordon(actor=SYSTEM, node=other, reason="operator's own")
    # Observations recorded without their cordon change (e.g. a gateway that died between).
    Node.objects.filter(pk=node.pk).update(
        inventory={**H100_INVENTORY, "storage_root_visible": False}
    )
    NodeCordon.objects.create(
        node=other,
        source=CordonSource.STORAGE,
        reason="storage root not visible",
        created_at=node.created_at,
    )
    assert storage_cordon_sweep() == {"cordoned": 1, "uncordoned": 1}
    assert cordons(node) == {"storage": "storage root not visible"}
    assert cordons(other) == {"operator": "operator's own"}
    assert storage_cordon_sweep() == {"cordoned": 0, "uncordoned": 0}  # idempotent
    assert AuditEvent.objects.filter(actor_label="storage").count() == 2


def test_L6_a_heartbeat_observation_is_kept_with_the_inventory(node):
    node_observe_storage_root(node_id=node.id, visible=False)
    assert Node.objects.get(pk=node.pk).inventory["storage_root_visible"] is False
