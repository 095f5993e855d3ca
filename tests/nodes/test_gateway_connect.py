"""The gateway's Connect handler in-process, driven step by step, for orderings a real stream
hits only by chance: a poll landing while a reconnect is being settled (L5), a heartbeat
arriving while the database threads are busy (L1).

The handler, its Streams, its database threads and the database are the real ones; only the
transport is replaced by a queue of messages and a context holding the node's certificate.
"""

import asyncio
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from django.db import OperationalError
from prometheus_client import REGISTRY

from audit.services import Actor
from nodes.agent.proto import control_pb2 as pb
from nodes.choices import CommandState
from nodes.gateway import Gateway, NodeControlService, service, streams
from nodes.gateway.db_threads import DatabaseThreads
from nodes.gateway.loops import deliver_pending
from nodes.gateway.streams import expire_pass
from nodes.models import ControlSession, NodeCommand
from nodes.services import commands, control
from nodes.services.join import node_join
from tests.conftest import H100_INVENTORY, make_csr

pytestmark = pytest.mark.django_db(transaction=True)
ADMIN = Actor.system("tests")
RUN = {"argv": ["true"]}


class Context:
    """What Connect reads of a grpc.aio context: the verified peer certificate."""

    def __init__(self, pem: str):
        self.pem = pem.encode()
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def auth_context(self):
        return {"x509_pem_cert": [self.pem]}

    async def abort(self, code: grpc.StatusCode, details: str):
        self.aborted = (code, details)
        raise AssertionError(f"aborted: {code} {details}")


class Peer:
    """A node's side of one stream: messages it sends, and what the gateway yields to it,
    taken as grpc takes it: as soon as it is yielded."""

    def __init__(self, gateway: Gateway, node_id: str, pem: str, hello: pb.Hello | None):
        self.node_id = node_id
        self.sending: asyncio.Queue = asyncio.Queue()
        if hello is not None:  # None: the test sends it, when it chooses
            self.sending.put_nowait(pb.NodeMessage(hello=hello))
        self.received: asyncio.Queue = asyncio.Queue()
        self.context = Context(pem)
        self.replies = NodeControlService(gateway=gateway).Connect(self._messages(), self.context)
        self.pump = asyncio.ensure_future(self._pump())

    async def _messages(self):
        while (message := await self.sending.get()) is not None:
            yield message

    async def _pump(self):
        async for reply in self.replies:
            self.received.put_nowait(reply)

    def send(self, **body) -> None:
        self.sending.put_nowait(pb.NodeMessage(**body))

    async def next(self, timeout: float = 10) -> pb.ControlMessage:
        return await asyncio.wait_for(self.received.get(), timeout)

    async def hang_up(self) -> None:
        self.sending.put_nowait(None)
        await asyncio.wait_for(self.pump, 10)


@pytest.fixture
def joined(node_fleet, mint):
    result = node_join(
        token=mint(node_fleet)[1],
        fleet_id=node_fleet.id,
        csr=make_csr()[1],
        inventory=H100_INVENTORY,
    )
    return result.node, result.certificate.pem


def held(monkeypatch, module, name: str) -> tuple[threading.Event, threading.Event]:
    """Make ``module.name`` wait, on its database thread, until released: (entered, release)."""
    real, entered, release = getattr(module, name), threading.Event(), threading.Event()

    def waiting(*args, **kwargs):
        entered.set()
        assert release.wait(20), f"{name} was never released"
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, waiting)
    return entered, release


def refused_opens() -> Counter:
    """The gateway's ``tuneplane_gateway_opens_refused_total`` by reason, as scraped."""
    return Counter(
        {
            sample.labels["reason"]: sample.value
            for metric in REGISTRY.collect()
            if metric.name == "tuneplane_gateway_opens_refused"
            for sample in metric.samples
            if sample.name.endswith("_total")
        }
    )


def in_own_loop(scenario):
    """Run ``scenario()`` on an event loop of its own, in a thread of its own: a browser test
    earlier in the session may have left one running on this thread."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, scenario()).result()


async def in_thread(event: threading.Event) -> None:
    assert await asyncio.get_running_loop().run_in_executor(None, event.wait, 20)


def test_L5_a_poll_during_reconnect_never_redelivers_what_the_hello_reported_finished(
    replica, joined, monkeypatch
):
    node, pem = joined
    finished = commands.node_command_create(actor=ADMIN, node=node, kind="run", payload=RUN)
    entered, release = held(monkeypatch, commands, "nodes_commands_reconcile")
    hello = pb.Hello(
        node_id=node.id,
        agent_version="test",
        commands=[pb.CommandState(command_id=str(finished.id), state="succeeded", exit_code=0)],
    )

    async def scenario() -> list[pb.ControlMessage]:
        peer = Peer(replica, node.id, pem, hello)
        welcome = asyncio.ensure_future(peer.next())
        await in_thread(entered)  # its Hello's session written, its commands not yet settled
        # The poll (or a Redis nudge) runs now and still reads the command as pending.
        await deliver_pending(replica, node_id=node.id)
        release.set()
        received = [await welcome]
        later = await replica.database.run(
            commands.node_command_create, actor=ADMIN, node=node, kind="run", payload=RUN
        )
        await deliver_pending(replica, node_id=node.id)
        received.append(await peer.next())
        await peer.hang_up()
        return received, str(later.id)

    (welcome, first_command), later_id = in_own_loop(scenario)

    assert welcome.WhichOneof("body") == "welcome"
    # The outbox is in order: a redelivered command would come before the later one.
    assert first_command.command.command_id == later_id
    assert NodeCommand.objects.get(pk=finished.pk).state == CommandState.SUCCEEDED


def test_L1_a_heartbeat_is_taken_while_the_database_threads_are_busy(replica, joined, monkeypatch):
    node, pem = joined
    entered, release = held(monkeypatch, control, "node_report_inventory")

    async def scenario():
        peer = Peer(replica, node.id, pem, pb.Hello(node_id=node.id, agent_version="test"))
        assert (await peer.next()).WhichOneof("body") == "welcome"
        stream = replica.streams.by_node[node.id]
        peer.send(
            inventory=pb.InventoryReport(cards=[pb.Card(name="NVIDIA H100 80GB HBM3", count=8)])
        )
        await in_thread(entered)  # the report's database work is held
        beat_before = stream.last_beat
        peer.send(heartbeat=pb.Heartbeat(sequence=1))
        ack = await peer.next()  # not after the report's write: now
        taken = (stream.last_beat > beat_before, stream.session_id in replica.batcher.pending)
        release.set()
        peer.send(heartbeat=pb.Heartbeat(sequence=2))
        second_ack = await peer.next()
        await peer.hang_up()
        return ack, taken, second_ack

    ack, (beat_advanced, lease_pending), second_ack = in_own_loop(scenario)

    assert ack.heartbeat_ack.sequence == 1 and second_ack.heartbeat_ack.sequence == 2
    assert beat_advanced and lease_pending


def test_L1_a_heartbeat_going_backwards_renews_nothing_and_its_ack_says_so(replica, joined):
    node, pem = joined

    async def scenario():
        peer = Peer(replica, node.id, pem, pb.Hello(node_id=node.id, agent_version="test"))
        assert (await peer.next()).WhichOneof("body") == "welcome"
        stream = replica.streams.by_node[node.id]
        peer.send(heartbeat=pb.Heartbeat(sequence=5))
        acks = [(await peer.next()).heartbeat_ack.sequence]
        replica.batcher.pending.clear()
        taken_at = stream.last_beat
        for sequence in (3, 5):  # backwards, then a repeat
            peer.send(heartbeat=pb.Heartbeat(sequence=sequence))
            acks.append((await peer.next()).heartbeat_ack.sequence)
        renewed = (stream.last_beat != taken_at, stream.session_id in replica.batcher.pending)
        peer.send(heartbeat=pb.Heartbeat(sequence=6))
        acks.append((await peer.next()).heartbeat_ack.sequence)
        await peer.hang_up()
        return acks, renewed

    acks, renewed = in_own_loop(scenario)

    assert acks == [5, 5, 5, 6]  # the dropped beats' acks name the last one taken
    assert renewed == (False, False)


def test_L5_a_report_the_database_cannot_take_ends_the_stream_to_be_told_again(
    replica, joined, monkeypatch
):
    node, pem = joined
    command = commands.node_command_create(actor=ADMIN, node=node, kind="run", payload=RUN)

    def database_away(**_):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(commands, "node_command_report", database_away)

    async def scenario():
        peer = Peer(replica, node.id, pem, pb.Hello(node_id=node.id, agent_version="test"))
        assert (await peer.next()).WhichOneof("body") == "welcome"
        assert (await peer.next()).command.command_id == str(command.id)
        peer.send(
            command_update=pb.CommandUpdate(
                state=pb.CommandState(
                    command_id=str(command.id), state=CommandState.SUCCEEDED, exit_code=0
                )
            )
        )
        closed = await peer.next()
        await peer.hang_up()
        return closed

    closed = in_own_loop(scenario)

    # Not dropped quietly: the stream ends, and the reconnect's Hello reports it again.
    assert closed.close.reason == "the console could not store a command_update"
    assert not ControlSession.objects.filter(node=node, closed_at__isnull=True).exists()


def test_a_hello_later_than_the_hello_timeout_is_refused_and_one_within_it_welcomed(
    replica, joined, settings
):
    node, pem = joined
    settings.TUNEPLANE_HELLO_TIMEOUT = 1
    hello = pb.Hello(node_id=node.id, agent_version="test")
    refused_before = refused_opens()

    async def opened(hello_after: float):
        peer = Peer(replica, node.id, pem, hello=None)
        await asyncio.sleep(hello_after)
        peer.send(hello=hello)
        reply = asyncio.ensure_future(peer.next())
        await asyncio.wait([reply, peer.pump], timeout=10, return_when=asyncio.FIRST_COMPLETED)
        welcomed = reply.done() and reply.result().WhichOneof("body") == "welcome"
        reply.cancel()
        if welcomed:
            await peer.hang_up()
        else:  # the pump ends with the abort
            await asyncio.gather(peer.pump, return_exceptions=True)
        return welcomed, peer.context.aborted

    async def scenario():
        return await opened(hello_after=0.3), await opened(hello_after=1.6)

    (within, within_aborted), (late, late_aborted) = in_own_loop(scenario)

    assert within and within_aborted is None
    assert not late
    assert late_aborted[0] == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "TUNEPLANE_HELLO_TIMEOUT" in late_aborted[1]
    assert refused_opens() - refused_before == Counter({"hello timeout": 1})  # for operators
    assert not ControlSession.objects.filter(node=node, closed_at__isnull=True).exists()


def test_L1_silence_counts_from_the_welcome_not_while_the_console_settles_the_hello(
    replica, joined, monkeypatch
):
    node, pem = joined
    entered, release = held(monkeypatch, commands, "nodes_commands_reconcile")
    registry = replica.streams

    async def scenario():
        peer = Peer(replica, node.id, pem, pb.Hello(node_id=node.id, agent_version="test"))
        await in_thread(entered)  # registered, its Hello waiting on the database
        long_after = time.monotonic() + 1000
        while_settling = expire_pass(registry, now=long_after)
        release.set()
        welcome = await peer.next()
        after_welcome = expire_pass(registry, now=long_after)
        closed = await peer.next()
        await peer.hang_up()
        return while_settling, welcome, after_welcome, closed

    while_settling, welcome, after_welcome, closed = in_own_loop(scenario)

    assert while_settling == []
    assert welcome.WhichOneof("body") == "welcome"
    assert [s.node_id for s in after_welcome] == [node.id]  # the pass does judge, once welcomed
    assert closed.close.reason == "lease expired"


def test_L1_a_pass_the_gateway_runs_late_judges_no_stream(replica, joined):
    node, pem = joined

    async def scenario():
        peer = Peer(replica, node.id, pem, pb.Hello(node_id=node.id, agent_version="test"))
        assert (await peer.next()).WhichOneof("body") == "welcome"
        long_after = time.monotonic() + 1000
        late = expire_pass(replica.streams, now=long_after, late=streams.LATE_PASS_SECONDS + 0.5)
        on_time = expire_pass(replica.streams, now=long_after, late=0.01)
        await peer.hang_up()
        return late, on_time

    late, on_time = in_own_loop(scenario)

    assert late == [] and [s.node_id for s in on_time] == [node.id]


def test_L5_what_a_node_said_before_hanging_up_is_stored_after_it_has_gone(
    replica, joined, monkeypatch
):
    node, pem = joined
    command = commands.node_command_create(actor=ADMIN, node=node, kind="run", payload=RUN)
    entered, release = held(monkeypatch, control, "node_report_inventory")

    async def scenario():
        peer = Peer(replica, node.id, pem, pb.Hello(node_id=node.id, agent_version="test"))
        assert (await peer.next()).WhichOneof("body") == "welcome"
        assert (await peer.next()).command.command_id == str(command.id)
        peer.send(
            inventory=pb.InventoryReport(cards=[pb.Card(name="NVIDIA H100 80GB HBM3", count=8)])
        )
        await in_thread(entered)  # the report's write is held; the result waits behind it
        peer.send(
            command_update=pb.CommandUpdate(
                state=pb.CommandState(
                    command_id=str(command.id), state=CommandState.SUCCEEDED, exit_code=0
                )
            )
        )
        await peer.hang_up()  # a clean end: the stream is over
        release.set()
        await asyncio.wait_for(asyncio.gather(*replica.storing), 10)

    in_own_loop(scenario)

    assert NodeCommand.objects.get(pk=command.pk).state == CommandState.SUCCEEDED


def test_a_node_flooding_reports_faster_than_the_database_takes_them_is_closed(
    replica, joined, monkeypatch
):
    node, pem = joined
    entered, release = held(monkeypatch, control, "node_report_inventory")

    async def scenario():
        peer = Peer(replica, node.id, pem, pb.Hello(node_id=node.id, agent_version="test"))
        assert (await peer.next()).WhichOneof("body") == "welcome"
        peer.send(inventory=pb.InventoryReport())
        await in_thread(entered)
        for number in range(service.STORE_QUEUE + 1):
            peer.send(
                command_update=pb.CommandUpdate(
                    state=pb.CommandState(
                        command_id=f"c-flood-{number}", state=CommandState.RUNNING
                    )
                )
            )
        closed = await peer.next()
        release.set()
        await peer.hang_up()
        return closed

    closed = in_own_loop(scenario)

    # Neither a queue without bound nor a reader that stops taking heartbeats.
    assert closed.close.reason == "too many reports waiting for the database"


def test_L5_two_replicas_in_one_process_each_deliver_only_to_the_streams_they_hold(
    replica, node_fleet, mint
):
    """A replica is an object, not module state: two serve side by side, and a poll of one
    (pending commands of the sessions it recorded) reaches only its own streams."""
    pool = ThreadPoolExecutor(2, thread_name_prefix="test-gateway-b-db")
    other = Gateway(
        name="test-gateway:9443", database=DatabaseThreads(pool=pool, control_pool=pool)
    )
    nodes = [
        node_join(
            token=mint(node_fleet)[1],
            fleet_id=node_fleet.id,
            csr=make_csr(f"gpu-0{number}")[1],
            inventory=H100_INVENTORY,
        )
        for number in (1, 2)
    ]

    async def scenario():
        peers = [
            Peer(
                gateway,
                result.node.id,
                result.certificate.pem,
                pb.Hello(node_id=result.node.id, agent_version="test"),
            )
            for gateway, result in zip((replica, other), nodes, strict=True)
        ]
        for peer in peers:
            assert (await peer.next()).WhichOneof("body") == "welcome"
        # Each replica delivers what is pending once a session opens: let that pass end
        # first, or under load it is what delivers the commands made below.
        for gateway in (replica, other):
            await asyncio.gather(
                *(t for t in gateway.storing if "_deliver_after_open" in t.get_coro().__qualname__)
            )
        made = [
            await gateway.database.run(
                commands.node_command_create, actor=ADMIN, node=result.node, kind="run", payload=RUN
            )
            for gateway, result in zip((replica, other), nodes, strict=True)
        ]
        delivered = await deliver_pending(replica, gateway=replica.name)
        first = await peers[0].next()
        nothing_for_the_other = peers[1].received.empty()
        delivered_by_other = await deliver_pending(other, gateway=other.name)
        second = await peers[1].next()
        for peer in peers:
            await peer.hang_up()
        return made, delivered, first, nothing_for_the_other, delivered_by_other, second

    try:
        made, delivered, first, quiet, delivered_by_other, second = in_own_loop(scenario)
    finally:
        pool.shutdown(wait=True)

    assert set(replica.streams.by_node) == set(other.streams.by_node) == set()
    assert delivered == 1 and first.command.command_id == str(made[0].id)
    assert quiet
    assert delivered_by_other == 1 and second.command.command_id == str(made[1].id)
