"""The liveness sweep: L2–L4 per capability, set-based, idempotent, audited once."""

import threading
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from audit.models import AuditEvent
from nodes.choices import SchedulingState
from nodes.models import GatewayReplica, Node, NodeCordon, NodeCredential
from nodes.services.control import node_report_inventory
from nodes.services.cordons import node_cordon
from nodes.services.liveness import liveness_sweep
from nodes.services.sessions import session_open
from tests.conftest import H100_INVENTORY, SYSTEM
from tests.e2e.agents import wait_until


@pytest.fixture(autouse=True)
def console_listening(db):
    """A gateway replica that has been listening all along, so silence is evidence here; the
    grace rule's own tests below take it away."""
    return GatewayReplica.objects.create(
        name="test-gateway",
        started_at=timezone.now() - timedelta(days=1),
        seen_at=timezone.now() + timedelta(days=1),
    )


@pytest.fixture
def fleet_nodes(make_fleet):
    """``count`` schedulable nodes in a Fleet declaring ``capabilities``, made in bulk."""

    def make(fleet_id, capabilities, count=1, silent_for=0):
        fleet = make_fleet(fleet_id, kind="node", capabilities=capabilities)
        seen = timezone.now() - timedelta(seconds=silent_for)
        return Node.objects.bulk_create(
            [
                Node(
                    fleet=fleet,
                    hostname=f"{fleet_id}-{i}",
                    scheduling_state=SchedulingState.SCHEDULABLE,
                    inventory=H100_INVENTORY,
                    inventory_observed_at=seen,
                    last_seen_at=seen,
                )
                for i in range(count)
            ]
        )

    return make


def silent(node, seconds):
    Node.objects.filter(pk=node.pk).update(last_seen_at=timezone.now() - timedelta(seconds=seconds))


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
    assert list(
        AuditEvent.objects.filter(target_id=node.pk).order_by("id").values_list("action", flat=True)
    ) == ["node.quiet", "node.answering"]


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
    Node.objects.filter(pk=drained.pk).update(scheduling_state=SchedulingState.DRAINED)
    Node.objects.filter(pk=removed.pk).update(scheduling_state=SchedulingState.REMOVED)
    assert liveness_sweep()["gone"] == 0


def test_L1_back_from_gone_only_through_a_lease_and_fresh_inventory(node_fleet, mint):
    from nodes.services.join import node_join
    from tests.conftest import make_csr

    node = node_join(
        token=mint(node_fleet)[1], fleet_id="gpu-lab", csr=make_csr()[1], inventory=H100_INVENTORY
    ).node
    node_cordon(actor=SYSTEM, node=node, reason="bad fan")
    Node.objects.filter(pk=node.pk).update(scheduling_state=SchedulingState.GONE)
    session_open(
        node_id=node.id, serial=NodeCredential.objects.get(node=node).serial, gateway="test"
    )
    assert (
        Node.objects.get(pk=node.pk).scheduling_state == SchedulingState.GONE
    )  # a lease alone: no
    node_report_inventory(node_id=node.id, inventory=H100_INVENTORY)
    assert Node.objects.get(pk=node.pk).scheduling_state == SchedulingState.SCHEDULABLE
    assert NodeCordon.objects.get(node=node).reason == "bad fan"  # never touched


# SQLite caps the variables of one statement, so Django splits a large insert there;
# on PostgreSQL, the production store, the count is flat.
@pytest.mark.parametrize("count", [10, pytest.param(1000, marks=pytest.mark.postgres)])
def test_sweep_statements_do_not_grow_with_nodes(fleet_nodes, count, django_assert_max_num_queries):
    fleet_nodes("gpu", ["train", "serve", "env"], count=count, silent_for=301)
    fleet_nodes("fresh", ["serve"], count=count)
    # 21: the sweep, and one read for the sessions of silent gateway replicas.
    with django_assert_max_num_queries(21):
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
    assert Node.objects.filter(scheduling_state=SchedulingState.GONE).count() == 200
    assert AuditEvent.objects.filter(action="node.gone").count() == 200
    assert AuditEvent.objects.filter(action="node.quiet").count() == 400


def a_sweep_in_a_thread() -> tuple[threading.Thread, threading.Event, list]:
    """A liveness sweep on a thread (and database connection) of its own, not yet started;
    the event is set once it has finished, and the list holds what it raised."""
    swept, errors = threading.Event(), []

    def sweep():
        try:
            liveness_sweep()
            swept.set()
        except Exception as error:
            errors.append(error)
        finally:
            connection.close()

    return threading.Thread(target=sweep), swept, errors


def waiting_for_a_row_lock() -> bool:
    with connection.cursor() as cursor:  # pg_locks is read anew, unlike pg_stat_activity
        cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
        return cursor.fetchone()[0] > 0


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_sweep_takes_its_nodes_in_the_gateways_lock_order(make_fleet):
    """A sweep locks the nodes it judges in id order, as a gateway's batch does (sessions
    opened or closed, leases renewed): in the plan's order, a sweep during a restart's
    reconnect storm deadlocked a batch of 500 Hellos in every 10,000-node restart (issue
    20). Here the plan's order is the reverse of the ids', and a gateway's transaction holds
    the middle node when the sweep starts; then it takes the next one up."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    fleet = make_fleet("gpu", kind="node", capabilities=["train", "serve"])
    now = timezone.now()
    # Stored, and last seen, in the reverse of id order: a scan meets n-3 first.
    Node.objects.bulk_create(
        Node(
            id=f"n-{i}",
            fleet=fleet,
            hostname=f"gpu-{i}",
            scheduling_state=SchedulingState.SCHEDULABLE,
            last_seen_at=now - timedelta(seconds=400 - i),
        )
        for i in (3, 2, 1)
    )
    sweeper, swept, errors = a_sweep_in_a_thread()
    try:
        with transaction.atomic():
            list(Node.objects.select_for_update().filter(pk="n-2"))
            sweeper.start()
            wait_until(waiting_for_a_row_lock, what="the sweep waiting for n-2")
            list(Node.objects.select_for_update().filter(pk="n-3"))  # deadlocked here before
    except DatabaseError as error:
        errors.append(error)
    sweeper.join(30)

    assert errors == [] and swept.is_set()
    assert Node.objects.filter(scheduling_state=SchedulingState.GONE).count() == 3


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_grace_a_sweep_locks_no_node_whose_verdict_stands(fleet_nodes, console_listening):
    """While silence is not yet evidence (a restarted console's first lease), a sweep judges
    every silent node and changes none, so it locks none: a gateway writing the nodes that
    are coming back is not held up behind it (issue 20)."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    console_listening.started_at = timezone.now()
    console_listening.save()
    node = fleet_nodes("gpu-lab", ["train", "serve"], silent_for=400)[0]
    sweeper, swept, errors = a_sweep_in_a_thread()
    with transaction.atomic():
        list(Node.objects.select_for_update().filter(pk=node.pk))  # a gateway's batch holds it
        sweeper.start()
        sweeper.join(10)
        held_up = sweeper.is_alive()
    sweeper.join(30)

    assert not held_up and swept.is_set() and errors == []
    assert not AuditEvent.objects.filter(action__in=["node.quiet", "node.gone"]).exists()


# -- a console outage is not a fleet outage -------------------------------------------------


def test_grace_no_gateway_listening_marks_nothing_quiet_or_gone_but_restores_answers(
    fleet_nodes, admin_api, console_listening
):
    silent_one = fleet_nodes("gpu-lab", ["train", "serve"], silent_for=400)[0]
    back = fleet_nodes("lab-2", ["serve"], silent_for=50)[0]
    liveness_sweep()
    assert shown(admin_api, back)["liveness"] == {"serve": "quiet"}
    console_listening.delete()  # every gateway down: the console hears nothing
    silent(back, 0)  # (a heartbeat recorded just before)
    changed = liveness_sweep()
    assert shown(admin_api, silent_one)["scheduling"]["state"] == "gone"  # judged before
    assert shown(admin_api, back)["liveness"] == {"serve": "ok"}
    assert changed["serve_ok"] == 1
    fresh = fleet_nodes("lab-3", ["train", "serve"], silent_for=400)[0]
    assert not any(v for k, v in liveness_sweep().items() if k.endswith("_quiet") or k == "gone")
    assert shown(admin_api, fresh)["scheduling"]["state"] == "schedulable"


def test_grace_a_restarted_gateway_gets_one_lease_before_silence_counts(
    fleet_nodes, admin_api, console_listening, settings
):
    """The failure this rule prevents: the console restarts after an outage and marks every
    node it has not heard from during its own downtime quiet or gone at once. After a
    restart, silence counts from the restart: a lease at least, then each threshold."""
    restarted = timezone.now()
    console_listening.started_at = restarted
    console_listening.save()
    node = fleet_nodes("gpu-lab", ["train", "serve"], silent_for=400)[0]

    def sweep_after(seconds):
        GatewayReplica.objects.update(seen_at=restarted + timedelta(seconds=seconds))
        liveness_sweep(now=restarted + timedelta(seconds=seconds))
        return shown(admin_api, node)

    settings.TUNEPLANE_LEASE_TTL = 30
    assert sweep_after(29)["liveness"] == {"train": "ok", "serve": "ok"}
    assert not AuditEvent.objects.filter(action__in=["node.quiet", "node.gone"]).exists()
    assert sweep_after(45)["liveness"] == {"train": "ok", "serve": "quiet"}
    assert sweep_after(299)["scheduling"]["state"] == "schedulable"
    assert sweep_after(300)["scheduling"]["state"] == "gone"


def test_grace_silence_counts_only_up_to_when_the_console_was_last_listening(
    fleet_nodes, admin_api, console_listening
):
    """A gateway that died 10 s ago heard nothing in those 10 s: a node silent for 50 s has
    been silent for only 40 s of the console's listening, under serve's 45 s."""
    now = timezone.now()
    console_listening.seen_at = now - timedelta(seconds=10)
    console_listening.save()
    node = fleet_nodes("gpu-lab", ["serve"], silent_for=50)[0]
    liveness_sweep(now=now)
    assert shown(admin_api, node)["liveness"] == {"serve": "ok"}
    silent(node, 56)
    liveness_sweep(now=now)
    assert shown(admin_api, node)["liveness"] == {"serve": "quiet"}


def test_grace_a_replica_that_could_not_announce_for_a_lease_listens_anew(
    console_listening, settings
):
    """Its database was away: it heard nothing it could record, so the grace applies again."""
    from nodes.services.control import gateway_alive, gateway_started
    from nodes.services.liveness import console_hearing

    console_listening.delete()  # this replica alone
    replica = gateway_started(name="gw-1")
    GatewayReplica.objects.filter(pk="gw-1").update(
        started_at=timezone.now() - timedelta(hours=1),
        seen_at=timezone.now() - timedelta(seconds=settings.TUNEPLANE_LEASE_TTL + 1),
    )
    gateway_alive(name="gw-1", started_at=replica.started_at)
    hearing = console_hearing(timezone.now())
    assert timezone.now() - hearing.since < timedelta(seconds=5)
    assert not hearing.judges("serve")
