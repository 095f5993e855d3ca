"""Issue 17, items 10–13: an enrolled node's certificate is a credential on a machine we do not
control, and its messages are hostile input. What it sends costs the console a bounded number
of audit rows, rows and database seconds, and its stream beside a real agent's goes on."""

import time

import grpc
import pytest

from audit.models import AuditEvent
from nodes.agent.proto import control_pb2 as pb
from nodes.agent.proto import control_pb2_grpc
from nodes.models import ControlSession, NodeCordon, StrayCommand

from .agents import credentials, wait_until
from .test_gateway_hostile import Stream, still_beating

pytestmark = pytest.mark.django_db(transaction=True)

LEASE_TTL = 3  # the e2e gateway's (tests/e2e/agents.py)


def storage_events(node):
    return AuditEvent.objects.filter(
        target_id=node.id, action__in=("node.cordoned", "node.uncordoned")
    )


def test_issue17_item10_toggling_the_storage_root_moves_the_cordon_once_a_lease(
    gateway, joined, bystander
):
    node, _, directory = joined
    stream = Stream(gateway, directory, node.id)
    try:
        assert stream.receive().WhichOneof("body") == "welcome"
        started = time.monotonic()
        for sequence in range(1, 2001):  # ends on False: the storage root is lost
            stream.send(
                pb.NodeMessage(
                    heartbeat=pb.Heartbeat(
                        sequence=sequence, storage_root_visible=sequence % 2 == 0
                    )
                )
            )
        for _ in range(2000):
            stream.receive()  # every heartbeat acknowledged: the stream went on
        sent_for = time.monotonic() - started
        # The latest state wins, within a lease of the last toggle.
        wait_until(
            lambda: NodeCordon.objects.filter(node=node, source="storage").exists(),
            what="the storage cordon, the latest state",
            timeout=LEASE_TTL + 5,
        )
        time.sleep(LEASE_TTL + 1)  # nothing further is pending
        moves = storage_events(node).count()
    finally:
        stream.close()
    # One move at the start of each lease the flood lasted, and the last state's.
    assert 1 <= moves <= int(sent_for / LEASE_TTL) + 2, (moves, sent_for)
    still_beating(bystander)


def test_issue17_item11_a_hello_with_too_many_command_states_is_refused_before_the_database(
    gateway, joined, bystander
):
    node, _, directory = joined
    states = [pb.CommandState(command_id=f"c-{i:05}", state="running") for i in range(1001)]
    hello = pb.NodeMessage(hello=pb.Hello(node_id=node.id, commands=states))
    started = time.monotonic()
    with grpc.secure_channel(gateway, credentials(directory)) as channel:
        call = control_pb2_grpc.NodeControlStub(channel).Connect(iter([hello]), timeout=30)
        with pytest.raises(grpc.RpcError) as refused:
            next(call)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "at most 1000 command states" in refused.value.details()
    assert time.monotonic() - started < 5
    assert not ControlSession.objects.filter(node=node).exists()
    assert not StrayCommand.objects.filter(node=node).exists()
    assert not AuditEvent.objects.filter(action="node_command.stray_reported").exists()
    still_beating(bystander)
