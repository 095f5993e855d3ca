"""A member's output, fetched from its node over the control stream: its tail, or what was
written from an offset on (how a client follows a log: it polls with the ``next_offset``
of the answer before; no request waits for output to come).

Logs stay on the node, kept there for its administrator for a retention; the console
keeps none of it. A fetch is a row in transit: the web writes it and waits, the gateway
replica holding the node's stream asks the agent and writes the answer, the web reads it
and deletes the row. A node that is not connected cannot answer: that is said at once.
These are reads of the node, not changes: nothing here is audited.
"""

import time
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from tuneplane.errors import NotFound, Unavailable

from .. import bus
from ..agent.wire import LOG_TAIL_MAX
from ..models import ControlSession, LogFetch, Node

MAX_TAIL_BYTES = LOG_TAIL_MAX  # R15: below the gRPC frame, with room to spare
WAIT_SECONDS = 10.0
POLL_SECONDS = 0.05
# A request nobody answered (the stream ended meanwhile) is dropped after this.
STALE = timedelta(seconds=60)


@dataclass(frozen=True)
class LogRead:
    data: bytes
    # Where data starts in the member's output, and just past it (None for both from an
    # agent older than offsets, which answers the tail and cannot say where it starts).
    offset: int | None
    next_offset: int | None
    # What was asked reaches before the oldest byte the node keeps (cut at the member's log
    # limit): data starts at that oldest byte.
    truncated: bool


def _connected(node: Node) -> bool:
    now = timezone.now()
    return ControlSession.objects.filter(
        node=node, closed_at__isnull=True, lease_expires_at__gt=now
    ).exists()


def log_read(
    *,
    node: Node,
    member: str,
    tail_bytes: int,
    offset: int | None = None,
    wait: float = WAIT_SECONDS,
) -> LogRead:
    """Up to ``tail_bytes`` of a member's output from byte ``offset`` on, or its last
    ``tail_bytes`` without one, from its node now. Unavailable (503) when the node is not
    connected or does not answer in time, or cannot read from an offset (an agent older than
    offsets); NotFound when the node has no log of that member (its retention removed it)."""
    if not _connected(node):
        raise Unavailable(
            f"Node '{node.id}' is not connected: a member's output stays on its node and is "
            "read from it over its control stream. Try again once it is connected.",
            code="node_not_connected",
        )
    now = timezone.now()
    LogFetch.objects.filter(created_at__lt=now - STALE).delete()
    with transaction.atomic():
        fetch = LogFetch.objects.create(
            node=node,
            member=member,
            tail_bytes=min(tail_bytes, MAX_TAIL_BYTES),
            offset=offset,
            created_at=now,
        )
        bus.publish_on_commit(bus.COMMANDS, node.id)
    deadline = time.monotonic() + wait
    try:
        while time.monotonic() < deadline:
            answered = LogFetch.objects.filter(pk=fetch.pk, answered_at__isnull=False).first()
            if answered is not None:
                return _answer(node, answered)
            time.sleep(POLL_SECONDS)
    finally:
        LogFetch.objects.filter(pk=fetch.pk).delete()
    raise Unavailable(
        f"Node '{node.id}' did not answer within {wait:.0f} s.", code="node_not_answering"
    )


def _answer(node: Node, answered: LogFetch) -> LogRead:
    if not answered.found:
        raise NotFound(
            f"Node '{node.id}' has no output of that member (kept for its "
            "retention, then removed by the node)."
        )
    if answered.offset is not None and answered.data_offset is None:
        raise Unavailable(
            f"Node '{node.id}' runs an agent too old to read a log from an offset; "
            "ask for its tail (no offset), or upgrade the agent.",
            code="agent_outdated",
        )
    return LogRead(
        data=bytes(answered.data),
        offset=answered.data_offset,
        next_offset=answered.next_offset,
        truncated=answered.truncated,
    )


def log_fetches_pending(
    *, node_id: str | None = None, node_ids: list[str] | None = None, gateway: str | None = None
) -> list:
    """Unanswered fetches of one node, of several, or of the nodes whose stream is on one
    replica."""
    pending = LogFetch.objects.filter(
        answered_at__isnull=True, created_at__gte=timezone.now() - STALE
    )
    if node_id is not None:
        pending = pending.filter(node_id=node_id)
    if node_ids is not None:
        pending = pending.filter(node_id__in=node_ids)
    if gateway is not None:
        pending = pending.filter(
            node__sessions__gateway=gateway, node__sessions__closed_at__isnull=True
        )
    return list(pending.defer("data"))


def log_fetch_answer(
    *,
    node_id: str,
    request_id: str,
    found: bool,
    data: bytes,
    offset: int | None = None,
    next_offset: int = 0,
    truncated: bool = False,
) -> bool:
    """A node's LogTail: stored on its own request only, cut to what was asked (a tail from
    its end, a read from an offset from its start), its offsets moved to what is kept."""
    try:
        uuid.UUID(request_id)
    except ValueError:
        return False
    fetch = LogFetch.objects.filter(pk=request_id, node_id=node_id).defer("data").first()
    if fetch is None:
        return False
    limit = fetch.tail_bytes
    if fetch.offset is not None:
        kept = bytes(data[:limit])
    else:
        kept = bytes(data[-limit:]) if limit else b""
        if offset is not None:
            offset += len(data) - len(kept)
    LogFetch.objects.filter(pk=fetch.pk, answered_at__isnull=True).update(
        answered_at=timezone.now(),
        found=found,
        data=kept,
        data_offset=offset,
        next_offset=None if offset is None else offset + len(kept),
        truncated=truncated,
    )
    return True
