"""Issue 17, items 10–13: an enrolled node's certificate is a credential on a machine we do not
control, and its messages are hostile input. What it sends costs the console a bounded number
of audit rows, rows and database seconds, and its stream beside a real agent's goes on."""

import time

import pytest

from audit.models import AuditEvent
from nodes.agent.proto import control_pb2 as pb
from nodes.models import NodeCordon

from .agents import wait_until
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
