"""The streams one gateway replica holds: each node's outbox and what was sent on it, the
batch that renews their leases, and the pass that closes a stream gone silent."""

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from ..agent import wire
from ..agent.proto import control_pb2 as pb
from ..services import control
from .db_threads import DatabaseThreads
from .metrics import LEASE_BATCH, LEASE_FLUSH

logger = logging.getLogger("tuneplane.gateway")

# An expiry pass this late says the replica's loop is behind, not that its nodes are silent.
LATE_PASS_SECONDS = 1.0


@dataclass(eq=False)
class Stream:
    """One node's open stream on this replica: its outbox, and the commands sent on it."""

    node_id: str
    session_id: str
    outbox: asyncio.Queue = field(default_factory=asyncio.Queue)
    sent: set[str] = field(default_factory=set)
    # Digest of the inventory the console stored from this stream (see Heartbeat in the proto).
    inventory_digest: str = ""
    # Its silence counts from the Welcome: before it, the wait is the console's, not the node's.
    welcomed: bool = False
    last_beat: float = field(default_factory=time.monotonic)
    # When each ack still in the outbox was queued, in order (the ack latency metric).
    acks_queued: deque = field(default_factory=deque)

    def deliver(self, commands) -> int:
        """Queue commands not yet sent on this stream; the agent de-duplicates by id too."""
        fresh = [command for command in commands if command.id not in self.sent]
        for command in fresh:
            self.sent.add(command.id)
            self.outbox.put_nowait(wire.command_message(command.id, command.kind, command.payload))
        return len(fresh)

    def ask_for_log(self, fetch) -> None:
        key = f"log:{fetch.pk}"
        if key not in self.sent:
            self.sent.add(key)
            self.outbox.put_nowait(
                wire.log_request(str(fetch.pk), fetch.member, fetch.tail_bytes, fetch.offset)
            )

    def close(self, reason: str) -> None:
        self.outbox.put_nowait(pb.ControlMessage(close=pb.Close(reason=reason)))
        self.outbox.put_nowait(None)


class Streams:
    """The streams this replica holds, by node: a newer one closes the older."""

    def __init__(self):
        self.by_node: dict[str, Stream] = {}

    def take(self, stream: Stream) -> None:
        older = self.by_node.get(stream.node_id)
        if older is not None:
            older.close("replaced by a newer stream")
        self.by_node[stream.node_id] = stream

    def release(self, stream: Stream) -> None:
        if self.by_node.get(stream.node_id) is stream:
            del self.by_node[stream.node_id]

    def close(self, node_id: str, reason: str, *, session_id: str | None = None) -> None:
        stream = self.by_node.get(node_id)
        if stream is not None and session_id in (None, stream.session_id):
            self.release(stream)
            stream.close(reason)


class LeaseBatcher:
    """Collects heartbeats and renews their leases in one batch per flush interval."""

    def __init__(self, streams: Streams, database: DatabaseThreads):
        self.streams = streams
        self.database = database
        self.pending: dict[str, tuple[str, datetime]] = {}
        self.inventory_fresh: set[str] = set()

    def touch(self, stream: Stream, *, inventory_unchanged: bool) -> None:
        self.pending[stream.session_id] = (stream.node_id, timezone.now())
        if inventory_unchanged:
            self.inventory_fresh.add(stream.session_id)
        else:
            self.inventory_fresh.discard(stream.session_id)

    async def flush(self) -> None:
        batch, self.pending = self.pending, {}
        fresh, self.inventory_fresh = self.inventory_fresh, set()
        if not batch:
            return
        started = time.perf_counter()
        renewed = await self.database.run(
            control.leases_renew,
            {sid: at for sid, (_, at) in batch.items()},
            inventory_fresh=fresh,
            control=True,
        )
        LEASE_FLUSH.observe(time.perf_counter() - started)
        LEASE_BATCH.observe(len(batch))
        for session_id in batch.keys() - renewed:
            # Closed by the console meanwhile: its node was removed (D4), or it reconnected
            # elsewhere. Either way this stream no longer speaks for the node.
            self.streams.close(
                batch[session_id][0], "session closed by the console", session_id=session_id
            )

    async def run(self) -> None:
        while True:
            await asyncio.sleep(settings.TUNEPLANE_HEARTBEAT_FLUSH_INTERVAL)
            try:
                await self.flush()
            except Exception:  # a failed flush is retried with the next batch's timestamps
                logger.exception("lease flush failed")


def expire_pass(streams: Streams, *, now: float, late: float = 0.0) -> list[Stream]:
    """Close the welcomed streams silent for a whole lease: a half-open connection must not
    look like a live node. A pass that runs ``late`` by more than LATE_PASS_SECONDS judges
    nothing: this replica's own loop was behind, so a heartbeat may be waiting unread (the
    node's lease in the database is judged by the liveness sweep meanwhile, L1)."""
    if late > LATE_PASS_SECONDS:
        logger.warning("gateway loop ran %.1f s late; no stream judged silent on this pass", late)
        return []
    silent_since = now - settings.TUNEPLANE_LEASE_TTL
    silent = [s for s in streams.by_node.values() if s.welcomed and s.last_beat < silent_since]
    for stream in silent:
        logger.info("node %s silent for a lease; closing its stream", stream.node_id)
        streams.close(stream.node_id, "lease expired", session_id=stream.session_id)
    return silent
