"""F7 end to end: a Fleet is deletable once its nodes are removed, and only then; a removed
node's record outlives it, detached, with everything the audit log needs of it."""

import pytest
from django.db import IntegrityError, transaction

from audit.models import AuditEvent
from audit.services import Actor
from fleets.models import Fleet
from nodes.choices import SchedulingState
from nodes.models import ControlSession, Node, NodeCommand, NodeCredential
from nodes.services.commands import Reported, node_command_create, node_command_report
from nodes.services.drains import node_drain
from nodes.services.join import node_join
from nodes.services.removal import node_remove
from nodes.services.sessions import session_open
from tests.conftest import H100_INVENTORY, SYSTEM, make_csr

FLEET = "/api/fleets/gpu-lab"


@pytest.fixture
def joined(node_fleet, mint):
    """A node of gpu-lab with a record worth keeping: a credential, a control session, a
    command it ran to the end."""

    def join(hostname="gpu-01"):
        result = node_join(
            token=mint(node_fleet)[1],
            fleet_id=node_fleet.id,
            csr=make_csr(hostname)[1],
            inventory=H100_INVENTORY,
            hostname=hostname,
            address="10.0.0.1:1",
        )
        session_open(node_id=result.node.id, serial=result.certificate.serial, gateway="gw-1")
        command = node_command_create(
            actor=SYSTEM, node=result.node, kind="run", payload={"argv": ["true"]}
        )
        node_command_report(node_id=result.node.id, reported=Reported(command.id, "succeeded", 0))
        return result.node

    return join


def removed_over_the_api(api, node: Node) -> None:
    assert (
        api.post(f"/api/nodes/{node.id}/drain", {"reason": "leaving the rack"}).json()[
            "scheduling"
        ]["state"]
        == "drained"
    )
    assert api.delete(f"/api/nodes/{node.id}").json()["scheduling"]["state"] == "removed"


def test_F7_a_fleet_whose_nodes_are_all_removed_is_deleted_and_they_are_kept_detached(
    admin_api, joined
):
    node = joined()
    removed_over_the_api(admin_api, node)
    kept = {
        "credentials": NodeCredential.objects.filter(node=node).count(),
        "sessions": ControlSession.objects.filter(node=node).count(),
        "commands": NodeCommand.objects.filter(node=node).count(),
    }
    trail = list(
        AuditEvent.objects.filter(target_type="nodes.node", target_id=node.id)
        .order_by("id")
        .values_list("id", "action")
    )

    assert admin_api.delete(FLEET).status_code == 204

    assert not Fleet.objects.filter(pk="gpu-lab").exists()
    node.refresh_from_db()
    assert (node.fleet_id, node.former_fleet, node.scheduling_state) == (
        None,
        "gpu-lab",
        SchedulingState.REMOVED,
    )
    assert (
        kept
        == {
            "credentials": NodeCredential.objects.filter(node=node).count(),
            "sessions": ControlSession.objects.filter(node=node).count(),
            "commands": NodeCommand.objects.filter(node=node).count(),
        }
        == {"credentials": 1, "sessions": 1, "commands": 1}
    )
    after = list(
        AuditEvent.objects.filter(target_type="nodes.node", target_id=node.id)
        .order_by("id")
        .values_list("id", "action")
    )
    assert after[:-1] == trail and [action for _, action in trail] == [
        "node.joined",
        "node.drained",
        "node.removed",
    ]
    detached = AuditEvent.objects.get(action="node.detached", target_id=node.id)
    assert (detached.actor_label, detached.before, detached.after) == (
        "ops",
        {"fleet": "gpu-lab"},
        {"fleet": None, "former_fleet": "gpu-lab"},
    )
    deleted = AuditEvent.objects.get(action="fleet.deleted", target_id="gpu-lab")
    assert deleted.before["nodes_detached"] == [node.id] and deleted.before["kind"] == "node"

    shown = admin_api.get(f"/api/nodes/{node.id}")
    assert shown.status_code == 200, shown.content
    body = shown.json()
    assert (body["fleet"], body["former_fleet"], body["liveness"]) == (None, "gpu-lab", {})
    assert body["scheduling"]["state"] == "removed"
    assert admin_api.get("/api/nodes").json()["count"] == 1


def test_F7_a_new_fleet_of_the_same_id_does_not_claim_the_old_nodes(admin_api, joined, make_fleet):
    node = joined()
    removed_over_the_api(admin_api, node)
    assert admin_api.delete(FLEET).status_code == 204
    make_fleet("gpu-lab", kind="node")
    assert admin_api.get("/api/nodes?fleet=gpu-lab").json()["count"] == 0
    assert admin_api.delete(FLEET).status_code == 204  # nothing of the old Fleet blocks it
    assert Node.objects.get(pk=node.pk).former_fleet == "gpu-lab"


def test_F7_a_gone_node_blocks_deletion_and_is_named_removed_ones_are_not_counted(
    admin_api, joined
):
    removed, gone = joined("gpu-01"), joined("gpu-02")
    removed_over_the_api(admin_api, removed)
    Node.objects.filter(pk=gone.pk).update(scheduling_state=SchedulingState.GONE)

    response = admin_api.delete(FLEET)

    assert response.status_code == 409, response.content
    error = response.json()["error"]
    assert error["rule"] == "F7"
    assert error["blockers"] == [f"1 node ({gone.id}); remove them first"]
    assert gone.id in error["message"] and removed.id not in error["message"]
    assert Fleet.objects.filter(pk="gpu-lab").exists()
    assert set(Node.objects.filter(fleet_id="gpu-lab").values_list("id", flat=True)) == {
        removed.id,
        gone.id,
    }
    assert not AuditEvent.objects.filter(action__in=["fleet.deleted", "node.detached"]).exists()

    assert admin_api.delete(f"/api/nodes/{gone.id}?force=true").status_code == 200
    assert admin_api.delete(FLEET).status_code == 204
    assert set(Node.objects.filter(former_fleet="gpu-lab").values_list("id", flat=True)) == {
        removed.id,
        gone.id,
    }


def test_F7_only_a_removed_node_is_ever_without_its_fleet(joined, node_fleet):
    """The database holds it too: a Fleet deleted around the service, or a node detached
    without the Fleet it was in, is refused."""
    live = joined()
    with pytest.raises(IntegrityError), transaction.atomic():
        Fleet.objects.filter(pk=node_fleet.pk).delete()
    node_drain(actor=SYSTEM, node=live, reason="leaving the rack")
    node_remove(actor=SYSTEM, node=live)
    with pytest.raises(IntegrityError), transaction.atomic():
        Node.objects.filter(pk=live.pk).update(fleet=None)
    assert Node.objects.get(pk=live.pk).fleet_id == "gpu-lab"


@pytest.fixture
def staff(client, admin_user):
    client.force_login(admin_user)
    return client


def test_F7_the_admin_deletes_a_fleet_whose_nodes_are_removed_and_lists_them_after(
    staff, admin_user, joined
):
    node = joined()
    node_drain(actor=Actor.of_user(admin_user), node=node, reason="leaving the rack")
    node_remove(actor=Actor.of_user(admin_user), node=node)
    delete = "/admin/fleets/fleet/gpu-lab/delete/"

    confirm = staff.get(delete)
    assert confirm.status_code == 200
    assert "permission" not in confirm.content.decode()
    response = staff.post(delete, {"post": "yes"})

    assert response.status_code == 302, response.content.decode()[-2000:]
    assert not Fleet.objects.exists()
    assert Node.objects.get(pk=node.pk).former_fleet == "gpu-lab"
    assert AuditEvent.objects.get(action="fleet.deleted").actor_label == "ops"
    listed = staff.get("/admin/nodes/node/")
    assert listed.status_code == 200
    assert "gpu-lab (deleted)" in listed.content.decode()
    assert staff.get(f"/admin/nodes/node/{node.pk}/change/").status_code == 200


def test_F6_migrations_make_no_fleet_and_after_the_last_is_deleted_placement_makes_none(
    node_fleet, member_api
):
    """The test database was made by every migration: a Fleet here is the fixture's alone.
    Once it is deleted, a submission is refused and the allocator's pass over every Fleet
    runs, and still there is none (F6; from zero and across restarts: tests/e2e)."""
    from fleets.services import fleet_delete
    from placement.services.allocator import allocate_all

    assert list(Fleet.objects.values_list("id", flat=True)) == [node_fleet.id]
    fleet_delete(actor=SYSTEM, fleet=node_fleet)
    response = member_api.post(
        "/api/training-jobs", {"project": "ml", "name": "j", "cards": 1, "command": ["true"]}
    )
    assert response.status_code == 422
    allocate_all()
    assert not Fleet.objects.exists()
