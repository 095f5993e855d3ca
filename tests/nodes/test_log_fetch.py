"""The console's side of a log read (nodes/services/logs.py): what the node answers is kept to
what was asked (a tail from its end, a read from an offset from its start) with its offsets
moved to match, and an agent older than offsets is named rather than misread. The gateway's
part is played in-process: while the web waits for the answer, the node answers."""

import pytest

from nodes.models import LogFetch
from nodes.services import logs
from tests.conftest import H100_DEVICE_INVENTORY, placeable_node
from tuneplane.errors import Unavailable

pytestmark = pytest.mark.django_db


@pytest.fixture
def node(node_fleet, mint):
    return placeable_node(mint, node_fleet, H100_DEVICE_INVENTORY, "10.0.0.1:1")


def answering(monkeypatch, **answer):
    """The node answers each pending fetch with ``answer`` while the web waits."""

    def wait(_seconds):
        for fetch in logs.log_fetches_pending():
            logs.log_fetch_answer(node_id=fetch.node_id, request_id=str(fetch.pk), **answer)

    monkeypatch.setattr(logs.time, "sleep", wait)


def test_a_read_from_an_offset_is_kept_to_its_first_bytes_and_says_where_it_ends(node, monkeypatch):
    answering(monkeypatch, found=True, data=b"0123456789", offset=100, next_offset=110)
    read = logs.log_read(node=node, member="m-1", tail_bytes=4, offset=100)
    assert (read.data, read.offset, read.next_offset, read.truncated) == (b"0123", 100, 104, False)
    assert not LogFetch.objects.exists()  # the row in transit is gone


def test_a_tail_is_kept_to_its_last_bytes_and_its_offset_moved_to_them(node, monkeypatch):
    answering(monkeypatch, found=True, data=b"0123456789", offset=100, next_offset=110)
    read = logs.log_read(node=node, member="m-1", tail_bytes=4)
    assert (read.data, read.offset, read.next_offset) == (b"6789", 106, 110)


def test_a_read_past_a_cut_is_answered_truncated(node, monkeypatch):
    answering(monkeypatch, found=True, data=b"kept", offset=5000, next_offset=5004, truncated=True)
    read = logs.log_read(node=node, member="m-1", tail_bytes=100, offset=10)
    assert (read.offset, read.truncated) == (5000, True)


def test_an_agent_older_than_offsets_answers_tails_and_is_named_for_an_offset(node, monkeypatch):
    answering(monkeypatch, found=True, data=b"the tail")  # no offset in its LogTail
    tail = logs.log_read(node=node, member="m-1", tail_bytes=100)
    assert (tail.data, tail.offset, tail.next_offset) == (b"the tail", None, None)
    with pytest.raises(Unavailable) as refused:
        logs.log_read(node=node, member="m-1", tail_bytes=100, offset=0)
    assert refused.value.code == "agent_outdated" and "offset" in refused.value.message
