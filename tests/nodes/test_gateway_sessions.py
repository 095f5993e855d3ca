"""Hellos answered in batches (issue 20): every Hello that arrives while a batch is written
joins the next one, and a batch keeps each Hello's guarantees — one open session per node, a
newer stream replacing the older, a node that may not speak refused alone, and a session
opened for a stream that left meanwhile closed again.

The gateway's Connect handler in-process, as in test_gateway_connect: real Streams, real
database threads, the real database; the transport is a queue.
"""

import asyncio

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext

from audit.models import AuditEvent
from nodes.agent.proto import control_pb2 as pb
from nodes.choices import SchedulingState
from nodes.gateway.sessions import ABANDONED
from nodes.models import ControlSession, Node
from nodes.services import control, cordons, sessions
from nodes.services.join import node_join
from tests.conftest import H100_INVENTORY, make_csr

from .test_gateway_connect import Peer, held, in_own_loop, in_thread

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def enroll(node_fleet, mint):
    def enroll(count: int) -> list[tuple[Node, str]]:
        joined = [
            node_join(
                token=mint(node_fleet)[1],
                fleet_id=node_fleet.id,
                csr=make_csr()[1],
                inventory=H100_INVENTORY,
            )
            for _ in range(count)
        ]
        return [(result.node, result.certificate.pem) for result in joined]

    return enroll


def hello(node) -> pb.Hello:
    return pb.Hello(node_id=node.id, agent_version="test")


def batches_of(monkeypatch) -> list[list[str]]:
    """The node ids of each batch sessions_open is called with, as it is called."""
    calls, real = [], sessions.sessions_open

    def recording(*, hellos, **kwargs):
        calls.append([h.node_id for h in hellos])
        return real(hellos=hellos, **kwargs)

    monkeypatch.setattr(sessions, "sessions_open", recording)
    return calls


def test_hellos_arriving_while_a_batch_is_written_are_answered_by_one_more_call(
    replica, enroll, monkeypatch
):
    nodes = enroll(21)
    calls = batches_of(monkeypatch)
    entered, release = held(monkeypatch, sessions, "sessions_open")

    async def scenario():
        first = Peer(replica, nodes[0][0].id, nodes[0][1], hello(nodes[0][0]))
        await in_thread(entered)  # the first Hello's batch is being written
        rest = [Peer(replica, node.id, pem, hello(node)) for node, pem in nodes[1:]]
        await asyncio.sleep(0.2)  # every other Hello has joined the queue
        release.set()
        peers = [first, *rest]
        welcomes = [await peer.next() for peer in peers]
        for peer in peers:
            await peer.hang_up()
        return welcomes

    welcomes = in_own_loop(scenario)

    assert all(w.WhichOneof("body") == "welcome" for w in welcomes)
    assert [len(batch) for batch in calls] == [1, 20]
    assert len({w.welcome.session_id for w in welcomes}) == 21
    opened = AuditEvent.objects.filter(action="control_session.opened")
    assert sorted(opened.values_list("target_id", flat=True)) == sorted(
        w.welcome.session_id for w in welcomes
    )


def test_two_hellos_of_one_node_go_in_two_batches_and_the_newer_stream_wins(
    replica, enroll, monkeypatch
):
    (node, pem), (other, other_pem) = enroll(2)
    calls = batches_of(monkeypatch)
    entered, release = held(monkeypatch, sessions, "sessions_open")

    async def scenario():
        blocker = Peer(replica, other.id, other_pem, hello(other))
        await in_thread(entered)
        older = Peer(replica, node.id, pem, hello(node))
        await asyncio.sleep(0.1)
        newer = Peer(replica, node.id, pem, hello(node))
        await asyncio.sleep(0.1)
        release.set()
        got = [await older.next(), await newer.next()]
        closed = await older.next()  # the newer stream replaced it
        for peer in (blocker, newer):
            await peer.hang_up()
        return got, closed

    (older_welcome, newer_welcome), closed = in_own_loop(scenario)

    assert calls == [[other.id], [node.id], [node.id]]
    assert closed.close.reason == "replaced by a newer stream"
    older_session = ControlSession.objects.get(pk=older_welcome.welcome.session_id)
    newer_session = ControlSession.objects.get(pk=newer_welcome.welcome.session_id)
    assert older_session.close_reason == "replaced by a newer stream"
    assert newer_session.close_reason == "stream ended"  # open until its peer hung up


def test_a_node_that_may_not_speak_is_refused_alone_in_its_batch(replica, enroll, monkeypatch):
    (removed, removed_pem), (fine, fine_pem), (blocker, blocker_pem) = enroll(3)
    Node.objects.filter(pk=removed.pk).update(scheduling_state=SchedulingState.REMOVED)
    calls = batches_of(monkeypatch)
    entered, release = held(monkeypatch, sessions, "sessions_open")

    async def scenario():
        first = Peer(replica, blocker.id, blocker_pem, hello(blocker))
        await in_thread(entered)
        refused = Peer(replica, removed.id, removed_pem, hello(removed))
        welcomed = Peer(replica, fine.id, fine_pem, hello(fine))
        await asyncio.sleep(0.1)
        release.set()
        welcome = await welcomed.next()
        with pytest.raises(AssertionError) as aborted:
            await asyncio.wait_for(refused.pump, 10)
        for peer in (first, welcomed):
            await peer.hang_up()
        return welcome, str(aborted.value)

    welcome, aborted = in_own_loop(scenario)

    assert sorted(calls[1]) == sorted([removed.id, fine.id])  # one batch
    assert welcome.WhichOneof("body") == "welcome"
    assert "PERMISSION_DENIED" in aborted and f"node {removed.id} is removed" in aborted
    assert not ControlSession.objects.filter(node=removed).exists()


def test_a_session_opened_for_a_stream_that_left_while_waiting_is_closed_again(
    replica, enroll, monkeypatch
):
    (blocker, blocker_pem), (node, pem) = enroll(2)
    entered, release = held(monkeypatch, sessions, "sessions_open")

    async def scenario():
        first = Peer(replica, blocker.id, blocker_pem, hello(blocker))
        await in_thread(entered)
        gone = Peer(replica, node.id, pem, hello(node))
        await asyncio.sleep(0.1)
        gone.pump.cancel()  # the peer hangs up while its Hello waits for the next batch
        release.set()
        await first.next()
        for _ in range(100):
            if ControlSession.objects.filter(node=node, closed_at__isnull=False).exists():
                break
            await asyncio.sleep(0.05)
        await first.hang_up()

    in_own_loop(scenario)

    session = ControlSession.objects.get(node=node)
    assert session.closed_at is not None and session.close_reason == ABANDONED
    assert node.id not in replica.streams.by_node


def test_a_batch_the_database_refuses_is_written_again_one_hello_at_a_time(
    replica, enroll, monkeypatch
):
    (blocker, blocker_pem), *others = enroll(4)
    real = sessions.sessions_open
    entered, release = held(monkeypatch, sessions, "sessions_open")
    held_open = sessions.sessions_open

    def deadlocking(*, hellos, **kwargs):
        if len(hellos) > 1:
            raise OperationalError("deadlock detected")
        return (held_open if hellos[0].node_id == blocker.id else real)(hellos=hellos, **kwargs)

    monkeypatch.setattr(sessions, "sessions_open", deadlocking)

    async def scenario():
        first = Peer(replica, blocker.id, blocker_pem, hello(blocker))
        await in_thread(entered)
        peers = [Peer(replica, node.id, pem, hello(node)) for node, pem in others]
        await asyncio.sleep(0.1)
        release.set()
        welcomes = [await peer.next() for peer in peers]
        for peer in (first, *peers):
            await peer.hang_up()
        return welcomes

    welcomes = in_own_loop(scenario)

    assert all(w.WhichOneof("body") == "welcome" for w in welcomes)


def test_a_batch_of_hellos_costs_the_same_statements_whatever_its_size(enroll):
    """Issue 20: one statement per batch, not per node — here each Hello replacing an older
    stream, which closes it in the same batch."""

    def statements(count: int) -> int:
        nodes = enroll(count)
        hellos = []
        for node, _ in nodes:
            serial = node.credentials.get().serial
            sessions.session_open(node_id=node.id, serial=serial, gateway="gw-1")
            hellos.append(sessions.Hello(node.id, serial, "test"))
        with CaptureQueriesContext(connection) as queries:
            answers = sessions.sessions_open(hellos=hellos, gateway="gw-2")
        assert all(isinstance(a, sessions.Opened) for a in answers.values())
        return len(queries)

    assert statements(3) == statements(30)
    assert ControlSession.objects.filter(closed_at__isnull=True).count() == 33


@pytest.mark.parametrize(
    "state, named",
    [
        (SchedulingState.SCHEDULABLE, True),
        (SchedulingState.CORDONED, True),
        (SchedulingState.ENROLLED, False),  # its report is what makes it schedulable
        (SchedulingState.GONE, False),  # its report is what brings it back (L1)
    ],
)
def test_the_welcome_names_the_inventory_held_unless_the_node_must_report_it(enroll, state, named):
    ((node, _),) = enroll(1)
    Node.objects.filter(pk=node.pk).update(scheduling_state=state, inventory_digest="ab" * 32)
    serial = node.credentials.get().serial

    opened = sessions.sessions_open(hellos=[sessions.Hello(node.id, serial)], gateway="gw-1")

    assert opened[node.id].inventory_digest == ("ab" * 32 if named else "")


def test_a_report_keeps_its_digest_and_a_storage_observation_that_changes_it_drops_it(enroll):
    ((node, _),) = enroll(1)
    sessions.session_open(node_id=node.id, serial=node.credentials.get().serial, gateway="gw")
    control.node_report_inventory(node_id=node.id, inventory=H100_INVENTORY, digest="cd" * 32)
    assert Node.objects.get(pk=node.pk).inventory_digest == "cd" * 32

    cordons.node_observe_storage_root(node_id=node.id, visible=False)

    assert Node.objects.get(pk=node.pk).inventory_digest == ""  # no longer the report sent


def test_a_beat_agreeing_with_the_storage_state_on_record_writes_nothing(
    replica, enroll, monkeypatch
):
    """The console holds the node's storage state from its last stream: a reconnect's beat
    saying the same queues no write; one saying otherwise, at once (L6)."""
    (agreeing, agreeing_pem), (changed, changed_pem) = enroll(2)
    observed = []
    real = cordons.node_observe_storage_root

    def recording(*, node_id, visible):
        observed.append((node_id, visible))
        return real(node_id=node_id, visible=visible)

    monkeypatch.setattr(cordons, "node_observe_storage_root", recording)

    async def scenario():
        peers = [
            Peer(replica, node.id, pem, hello(node))
            for node, pem in ((agreeing, agreeing_pem), (changed, changed_pem))
        ]
        for peer, visible in zip(peers, (True, False), strict=True):
            assert (await peer.next()).WhichOneof("body") == "welcome"
            peer.send(heartbeat=pb.Heartbeat(sequence=1, storage_root_visible=visible))
            await peer.next()
        for _ in range(50):
            if observed:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        for peer in peers:
            await peer.hang_up()

    in_own_loop(scenario)  # both joined with H100_INVENTORY: the storage root visible

    assert observed == [(changed.id, False)]
