"""Telemetry on one gateway replica: each node's latest sample kept in memory as it
arrives — a dictionary assignment, off the heartbeat's path — and written in one batch per
TUNEPLANE_TELEMETRY_FLUSH_INTERVAL, so the console's writes per second stay flat in the
number of nodes and a node sending a flood of samples costs one row a flush like any other.
Only one flush is on the database threads at a time: telemetry never fills their queue."""

import asyncio
import logging
import time

from django.conf import settings

from ..agent import wire
from ..services.telemetry import telemetry_store
from .db_threads import DatabaseThreads
from .metrics import TELEMETRY_FLUSH, TELEMETRY_SAMPLES
from .streams import Streams

logger = logging.getLogger("tuneplane.gateway")


def _store(batch: dict) -> dict:
    """On a database thread: the messages read, checked and stored."""
    return telemetry_store(
        samples={
            node_id: (at, wire.telemetry_sample(message))
            for node_id, (at, message) in batch.items()
        }
    )


class TelemetryBatcher:
    def __init__(self, streams: Streams, database: DatabaseThreads):
        self.streams = streams
        self.database = database
        self.pending: dict[str, tuple[float, object]] = {}
        # Each node's latest stored sample, checked, by node: what the metrics export.
        self.latest: dict[str, tuple[float, dict]] = {}
        self.replaced = 0

    def take(self, node_id: str, message) -> None:
        if node_id in self.pending:
            self.replaced += 1
        self.pending[node_id] = (time.time(), message)

    def forget(self, node_id: str) -> None:
        """The node's stream left this replica: its figures are no longer this one's."""
        self.latest.pop(node_id, None)

    async def flush(self) -> dict | None:
        batch, self.pending = self.pending, {}
        replaced, self.replaced = self.replaced, 0
        TELEMETRY_SAMPLES.labels("received").inc(len(batch) + replaced)
        TELEMETRY_SAMPLES.labels("replaced").inc(replaced)
        if not batch:
            return None
        started = time.perf_counter()
        done = await self.database.run(_store, batch)
        TELEMETRY_FLUSH.observe(time.perf_counter() - started)
        TELEMETRY_SAMPLES.labels("stored").inc(done["stored"])
        TELEMETRY_SAMPLES.labels("refused").inc(len(done["refused"]))
        held = self.streams.by_node
        self.latest.update(
            (node_id, (batch[node_id][0], sample))
            for node_id, sample in done.pop("samples").items()
            if node_id in held
        )
        return done

    async def run(self) -> None:
        while True:
            await asyncio.sleep(settings.TUNEPLANE_TELEMETRY_FLUSH_INTERVAL)
            try:
                await self.flush()
            except Exception:  # the database is away, say: the next samples come anyway
                logger.exception("telemetry flush failed")
