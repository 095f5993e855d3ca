"""Races on PostgreSQL, with real threads: two administrators acting on one node at once,
and a Fleet deleted while a machine joins it or a deployment is admitted to it."""

import itertools
import random

import pytest
from django.db import connection

from audit.models import AuditEvent
from audit.services import Actor
from fleets.models import Fleet
from fleets.services import fleet_delete
from nodes.choices import CordonSource
from nodes.models import ControlSession, Node, NodeCordon, NodeCredential
from nodes.services.control import node_report_inventory
from nodes.services.cordons import node_cordon, node_uncordon
from nodes.services.drains import node_drain
from nodes.services.join import JoinRefused, JoinResult, node_join
from nodes.services.removal import node_remove
from nodes.services.sessions import session_open
from placement.models import Deployment
from placement.services.submission import deployment_submit
from tests.conftest import H100_INVENTORY, SERVE, make_csr
from tests.fleets.test_concurrency import race
from tuneplane.errors import ApplicationError

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

OPS, ANA = Actor.system("ops"), Actor.system("ana")


@pytest.fixture
def placeable(make_fleet, mint):
    def make(fleet_id="gpu-lab", capabilities=("train", "serve")):
        fleet = make_fleet(fleet_id, kind="node", capabilities=list(capabilities))
        joined = node_join(
            token=mint(fleet)[1], fleet_id=fleet_id, csr=make_csr()[1], inventory=H100_INVENTORY
        )
        session_open(node_id=joined.node.id, serial=joined.certificate.serial, gateway="test")
        return node_report_inventory(node_id=joined.node.id, inventory=H100_INVENTORY)

    return make


def verbs(node):
    """Every verb an administrator has, each a callable on this node."""
    return [
        lambda actor: node_cordon(actor=actor, node=node, reason=f"{actor.label}: fan"),
        lambda actor: node_cordon(actor=actor, node=node, reason=f"{actor.label}: disk"),
        lambda actor: node_uncordon(actor=actor, node=node),
        lambda actor: node_drain(actor=actor, node=node, reason="leaving the rack"),
        lambda actor: node_remove(actor=actor, node=node),
    ]


def replayed(node_id: str) -> tuple[str, bool]:
    """The node's scheduling state and whether it has an operator cordon, as its audit log
    tells it, every event checked against the one before (a change is applied once)."""
    state, cordoned = "schedulable", False
    for event in AuditEvent.objects.filter(target_id=node_id).order_by("id"):
        if event.action == "node.cordoned":
            assert (event.before["cordon"] is not None) == cordoned, event.after
            cordoned = True
        elif event.action == "node.uncordoned":
            assert cordoned, "uncordoned without a cordon"
            cordoned = False
        elif event.action in ("node.draining", "node.drained", "node.removed"):
            assert event.before["scheduling_state"] == state, (event.action, state)
            state = event.after["scheduling_state"]
    return state, cordoned


def test_two_administrators_at_once_leave_one_consistent_state_audited_once_per_change(placeable):
    random.seed(7)
    for _ in range(5):
        node = placeable(f"lab-{random.randrange(10**6)}")
        calls = [(actor, verb) for actor, verb in itertools.product((OPS, ANA), verbs(node))]
        calls = [random.choice(calls) for _ in range(12)]
        race(lambda i: calls[i][1](calls[i][0]), count=len(calls))
        node.refresh_from_db()
        state, cordoned = replayed(node.id)
        assert node.scheduling_state == state
        assert (
            NodeCordon.objects.filter(node=node, source=CordonSource.OPERATOR).exists() == cordoned
        )
        if state == "removed":
            assert not ControlSession.objects.filter(node=node, closed_at__isnull=True).exists()
            assert not NodeCredential.objects.filter(node=node, revoked_at__isnull=True).exists()


def test_F7_a_fleet_deleted_while_a_machine_joins_never_leaves_a_node_without_its_fleet(
    make_fleet, mint
):
    for round in range(8):
        fleet = make_fleet(f"lab-{round}", kind="node")
        secret = mint(fleet)[1]
        csr = make_csr()[1]
        results = race(
            lambda i: fleet_delete(actor=OPS, fleet=fleet)
            if i == 0
            else node_join(token=secret, fleet_id=fleet.id, csr=csr, inventory=H100_INVENTORY),
            count=2,
        )
        deleted, joined = results
        assert isinstance(joined, (JoinResult, JoinRefused)), joined
        assert deleted is None or isinstance(deleted, ApplicationError), deleted
        exists = Fleet.objects.filter(pk=fleet.id).exists()
        assert exists == isinstance(deleted, ApplicationError)
        assert Node.objects.filter(fleet_id=fleet.id).exists() == isinstance(joined, JoinResult)
        assert exists or not isinstance(joined, JoinResult)


def test_F7_a_fleet_deleted_while_a_deployment_is_admitted_never_leaves_one_without_it(
    placeable, member, project
):
    for round in range(6):
        node = placeable(f"serve-{round}", capabilities=("serve",))
        fleet = node.fleet
        # A Fleet with a node cannot be deleted at all: free it, keeping the node placeable.
        results = race(
            lambda i: fleet_delete(actor=OPS, fleet=fleet)
            if i == 0
            else deployment_submit(
                actor=Actor.of_user(member), project="ml", name="chat", fleet=fleet.id, **SERVE
            ),
            count=2,
        )
        deleted, admitted = results
        exists = Fleet.objects.filter(pk=fleet.id).exists()
        assert Deployment.objects.filter(fleet_id=fleet.id).exists() == isinstance(
            admitted, Deployment
        ), admitted
        assert exists or not isinstance(admitted, Deployment)
        assert not isinstance(deleted, Exception) or isinstance(deleted, ApplicationError), deleted
        assert not isinstance(admitted, Exception) or isinstance(admitted, ApplicationError), (
            admitted
        )
    connection.close()


def test_a_close_racing_a_reconnect_and_a_lease_flush_never_deadlocks(placeable):
    """The old stream's close, the new stream's open and a heartbeat flush, at once, over
    and over: each waits for the others (one lock order: the node, then its sessions)."""
    from django.utils import timezone

    from nodes.services.control import leases_renew
    from nodes.services.sessions import session_close

    node = placeable()
    serial = NodeCredential.objects.get(node=node).serial
    for _ in range(15):
        old = ControlSession.objects.get(node=node, closed_at__isnull=True)
        calls = [
            lambda: session_close(session_id=old.id, reason="stream ended"),
            lambda: session_open(node_id=node.id, serial=serial, gateway="b"),
            lambda: leases_renew({str(old.id): timezone.now()}),
        ]
        results = race(lambda i: calls[i](), count=len(calls))
        assert not [r for r in results if isinstance(r, Exception)], results
        open_now = ControlSession.objects.get(node=node, closed_at__isnull=True)
        assert Node.objects.get(pk=node.pk).lease_expires_at == open_now.lease_expires_at


def test_inserting_a_nodes_commands_never_waits_on_a_cordons_or_drains_row_lock(placeable):
    """A cordon or a drain locks the node's row FOR NO KEY UPDATE: the key-share lock a
    command's insert takes on its node (its foreign key) does not wait for it, so an
    allocator's batch never queues behind an operator's transaction."""
    import threading

    from django.db import transaction

    from nodes.services.commands import node_commands_create_many
    from nodes.services.cordons import node_locked

    node = placeable()
    holding, done = threading.Event(), threading.Event()

    def hold_the_lock():
        try:
            with transaction.atomic():
                node_locked(node.id)
                holding.set()
                done.wait(10)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    try:
        assert holding.wait(10)
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '2s'")
            [created] = node_commands_create_many(
                actor=OPS, commands=[(node.id, "run", {"argv": ["true"]})]
            )
        assert created.node_id == node.id
    finally:
        done.set()
        holder.join(10)
