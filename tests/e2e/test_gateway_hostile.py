"""Hostile peers on the control gateway: a plaintext client, backwards heartbeats, an
oversized message and a flood of Hellos. Each is refused or dropped, and a real agent's
stream beside it is unaffected."""

import queue
import threading
import time

import grpc
import pytest

from nodes.agent.proto import control_pb2 as pb
from nodes.agent.proto import control_pb2_grpc
from nodes.models import ControlSession

from .agents import credentials, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

OVER_THE_LIMIT = 2 * 1024 * 1024  # the gateway takes messages of up to 1 MiB


class Stream:
    """A hand-driven control stream: put messages in, read answers out."""

    def __init__(self, target, directory, node_id, *, channel=None):
        self.channel = channel or grpc.secure_channel(target, credentials(directory))
        self.outgoing: queue.Queue = queue.Queue()
        self.call = control_pb2_grpc.NodeControlStub(self.channel).Connect(
            iter(self.outgoing.get, None), timeout=30
        )
        self.send(pb.NodeMessage(hello=pb.Hello(node_id=node_id)))

    def send(self, message) -> None:
        self.outgoing.put(message)

    def beat(self, sequence: int) -> None:
        self.send(
            pb.NodeMessage(heartbeat=pb.Heartbeat(sequence=sequence, storage_root_visible=True))
        )

    def receive(self):
        return next(self.call)

    def close(self) -> None:
        self.outgoing.put(None)
        self.channel.close()


def still_beating(session) -> None:
    """Its session is the same open one, and a heartbeat renewed it after now."""
    since = time.time()
    wait_until(
        lambda: ControlSession.objects.get(pk=session.pk).last_heartbeat_at.timestamp() > since,
        what="a fresh heartbeat from the bystander",
        timeout=10,
    )
    current = ControlSession.objects.get(pk=session.pk)
    assert current.closed_at is None


def test_a_plaintext_client_is_refused_before_anything_reaches_the_database(gateway, joined):
    node, _, _ = joined
    with grpc.insecure_channel(gateway) as channel:
        call = control_pb2_grpc.NodeControlStub(channel).Connect(
            iter([pb.NodeMessage(hello=pb.Hello(node_id=node.id))]), timeout=5
        )
        with pytest.raises(grpc.RpcError) as refused:
            next(call)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert not ControlSession.objects.filter(node=node).exists()


def test_heartbeats_going_backwards_are_dropped_visibly_and_the_stream_goes_on(
    gateway, joined, bystander
):
    node, _, directory = joined
    stream = Stream(gateway, directory, node.id)
    try:
        assert stream.receive().WhichOneof("body") == "welcome"
        stream.beat(5)
        assert stream.receive().heartbeat_ack.sequence == 5
        stream.beat(3)  # backwards: no renewal, and an ack naming the last beat taken
        assert stream.receive().heartbeat_ack.sequence == 5
        stream.beat(5)  # a replay: the same
        assert stream.receive().heartbeat_ack.sequence == 5
        stream.beat(6)
        assert stream.receive().heartbeat_ack.sequence == 6
    finally:
        stream.close()
    still_beating(bystander)


def test_an_oversized_message_ends_only_its_own_stream(gateway, joined, bystander):
    node, _, directory = joined
    stream = Stream(gateway, directory, node.id)
    try:
        assert stream.receive().WhichOneof("body") == "welcome"
        stream.send(pb.NodeMessage(inventory=pb.InventoryReport(driver="x" * OVER_THE_LIMIT)))
        with pytest.raises(grpc.RpcError) as ended:
            while True:
                stream.receive()
    finally:
        stream.close()
    assert ended.value.code() in (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
    )
    assert "x" * 100 not in str(node.__class__.objects.get(pk=node.pk).inventory)
    still_beating(bystander)


def test_a_flood_of_hellos_leaves_one_session_and_the_others_untouched(gateway, joined, bystander):
    node, _, directory = joined
    streams = []
    with grpc.secure_channel(gateway, credentials(directory)) as channel:
        for _ in range(30):
            stream = Stream(gateway, directory, node.id, channel=channel)
            stream.send(pb.NodeMessage(hello=pb.Hello(node_id=node.id)))  # and again, inside
            streams.append(stream)
        assert streams[-1].receive().WhichOneof("body") == "welcome"
        wait_until(
            lambda: ControlSession.objects.filter(node=node).count() == 30,
            what="thirty sessions, each replacing the last",
        )
        assert ControlSession.objects.filter(node=node, closed_at__isnull=True).count() == 1
        for stream in streams:
            stream.outgoing.put(None)
    still_beating(bystander)


def test_a_malformed_message_ends_only_its_own_stream(gateway, joined, bystander):
    """Bytes that are no NodeMessage at all, on an authenticated channel."""
    node, _, directory = joined
    with grpc.secure_channel(gateway, credentials(directory)) as channel:
        raw = channel.stream_stream(
            "/tuneplane.node.v1.NodeControl/Connect",
            request_serializer=lambda data: data,
            response_deserializer=lambda data: data,
        )
        hello = pb.NodeMessage(hello=pb.Hello(node_id=node.id)).SerializeToString()
        release = threading.Event()

        def messages():
            yield hello
            yield b"\xff\xfe not a protobuf \x00" * 64
            release.wait(10)  # the client would go on: the server must end it

        call = raw(messages(), timeout=10)
        answers = []
        try:
            for answer in call:
                answers.append(answer)
        except grpc.RpcError as error:
            answers.append(error.code())
        finally:
            release.set()
    assert len(answers) == 1  # the Welcome; then the server ended the stream, not the client
    assert pb.ControlMessage.FromString(answers[0]).WhichOneof("body") == "welcome"
    closed = wait_until(
        lambda: ControlSession.objects.filter(node=node, closed_at__isnull=False).first(),
        what="its session closed",
    )
    assert closed.close_reason == "stream ended"  # at the bad bytes, not at the lease's end
    still_beating(bystander)
