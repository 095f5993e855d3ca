"""The liveness sweep: L2–L4 per capability, set-based, idempotent, audited once."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from audit.models import AuditEvent
from nodes.control import node_report_inventory, session_open
from nodes.liveness import liveness_sweep
from nodes.models import Node, NodeCordon, NodeCredential
from nodes.scheduling import node_cordon
from tests.conftest import H100_INVENTORY, SYSTEM


@pytest.fixture
def fleet_nodes(make_fleet):
    """``count`` schedulable nodes in a Fleet declaring ``capabilities``, made in bulk."""
    def make(fleet_id, capabilities, count=1, silent_for=0):
        fleet = make_fleet(fleet_id, kind="node", capabilities=capabilities)
        seen = timezone.now() - timedelta(seconds=silent_for)
        return Node.objects.bulk_create([
            Node(fleet=fleet, hostname=f"{fleet_id}-{i}", scheduling_state="schedulable",
                 inventory=H100_INVENTORY, inventory_observed_at=seen, last_seen_at=seen)
            for i in range(count)])
    return make


def silent(node, seconds):
    Node.objects.filter(pk=node.pk).update(
        last_seen_at=timezone.now() - timedelta(seconds=seconds))


def shown(admin_api, node):
    return admin_api.get(f"/api/nodes/{node.pk}").json()


def test_L4_gone_on_the_most_generous_threshold_not_the_tightest(fleet_nodes, admin_api):
    both = fleet_nodes("train-serve", ["train", "serve"], silent_for=46)[0]
    serve_only = fleet_nodes("serve-only", ["serve"], silent_for=46)[0]
    liveness_sweep()
    body = shown(admin_api, both)
    assert body["scheduling"]["state"] == "schedulable"  # not gone at 46 s
    assert body["liveness"] == {"train": "ok", "serve": "quiet"}  # L2 answers on its own
    assert shown(admin_api, serve_only)["scheduling"]["state"] == "gone"
    silent(both, 301)
    liveness_sweep()
    body = shown(admin_api, both)
    assert body["scheduling"]["state"] == "gone"
    assert body["liveness"] == {"train": "quiet", "serve": "quiet"}


def test_L3_env_quiet_and_back(fleet_nodes, admin_api):
    node = fleet_nodes("envs", ["train", "env"], silent_for=46)[0]
    liveness_sweep()
    assert shown(admin_api, node)["liveness"] == {"train": "ok", "env": "quiet"}
    silent(node, 0)
    liveness_sweep()
    assert shown(admin_api, node)["liveness"] == {"train": "ok", "env": "ok"}
    assert list(AuditEvent.objects.filter(target_id=node.pk).order_by("id")
                .values_list("action", flat=True)) == ["node.quiet", "node.answering"]


def test_a_sweep_twice_makes_each_transition_once(fleet_nodes):
    fleet_nodes("gpu", ["train", "serve"], count=3, silent_for=301)
    first = liveness_sweep()
    assert first["gone"] == 3 and first["serve_quiet"] == 3 and first["train_quiet"] == 3
    events = AuditEvent.objects.count()
    assert set(liveness_sweep().values()) == {0}
    assert AuditEvent.objects.count() == events
    gone = AuditEvent.objects.filter(action="node.gone")
    assert gone.count() == 3 and gone.first().before == {"scheduling_state": "schedulable"}


def test_drained_and_removed_nodes_are_not_declared_gone(fleet_nodes):
    drained, removed = fleet_nodes("gpu", ["train"], count=2, silent_for=301)
    Node.objects.filter(pk=drained.pk).update(scheduling_state="drained")
    Node.objects.filter(pk=removed.pk).update(scheduling_state="removed")
    assert liveness_sweep()["gone"] == 0


def test_L1_back_from_gone_only_through_a_lease_and_fresh_inventory(node_fleet, mint):
    from nodes.services import node_join
    from tests.conftest import make_csr

    node = node_join(token=mint(node_fleet)[1], fleet_id="gpu-lab", csr=make_csr()[1],
                     inventory=H100_INVENTORY).node
    node_cordon(actor=SYSTEM, node=node, reason="bad fan")
    Node.objects.filter(pk=node.pk).update(scheduling_state="gone")
    session_open(node_id=node.id, serial=NodeCredential.objects.get(node=node).serial,
                 gateway="test")
    assert Node.objects.get(pk=node.pk).scheduling_state == "gone"  # a lease alone: no
    node_report_inventory(node_id=node.id, inventory=H100_INVENTORY)
    assert Node.objects.get(pk=node.pk).scheduling_state == "schedulable"
    assert NodeCordon.objects.get(node=node).reason == "bad fan"  # never touched


# SQLite caps the variables of one statement, so Django splits a large insert there;
# on PostgreSQL, the production store, the count is flat.
@pytest.mark.parametrize("count", [10, pytest.param(1000, marks=pytest.mark.postgres)])
def test_sweep_statements_do_not_grow_with_nodes(fleet_nodes, count,
                                                 django_assert_max_num_queries):
    fleet_nodes("gpu", ["train", "serve", "env"], count=count, silent_for=301)
    fleet_nodes("fresh", ["serve"], count=count)
    with django_assert_max_num_queries(20):
        assert liveness_sweep()["gone"] == count


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_sweeps_at_once_make_each_transition_once(fleet_nodes):
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    fleet_nodes("gpu", ["train", "serve"], count=200, silent_for=301)
    start = threading.Barrier(2)

    def sweep():
        start.wait()
        try:
            liveness_sweep()
        finally:
            connection.close()

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert Node.objects.filter(scheduling_state="gone").count() == 200
    assert AuditEvent.objects.filter(action="node.gone").count() == 200
    assert AuditEvent.objects.filter(action="node.quiet").count() == 400
