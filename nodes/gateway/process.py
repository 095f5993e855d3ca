"""One gateway replica: everything a ``grpcserve`` process holds, in one object handed to what
needs it — its streams, the batch that renews their leases, its database threads, and the
store tasks that outlive their streams — so two replicas can run side by side in one process."""

import asyncio
import socket

from django.conf import settings
from django.utils import timezone

from . import loops
from .db_threads import DatabaseThreads
from .sessions import SessionBatches
from .streams import LeaseBatcher, Streams
from .telemetry import TelemetryBatcher


def replica_name(bind: str | None = None) -> str:
    """A gateway replica as control sessions record it: this host and the address it binds."""
    return f"{socket.gethostname()}:{bind or settings.TUNEPLANE_GATEWAY_BIND}"


class Gateway:
    def __init__(self, *, name: str | None = None, database: DatabaseThreads | None = None):
        self.name = name or replica_name()
        # When this replica began: every session it opens is younger, and those of its name
        # that are older, a killed predecessor's (control.sessions_left_open_close).
        self.serving_since = timezone.now()
        self.database = database or DatabaseThreads()
        self.streams = Streams()
        self.batcher = LeaseBatcher(self.streams, self.database)
        self.telemetry = TelemetryBatcher(self.streams, self.database)
        self.sessions = SessionBatches(self)
        # Store tasks outliving their stream until they have written what it said.
        self.storing: set[asyncio.Task] = set()

    def background(self) -> list:
        """What a replica runs beside its streams."""
        return [
            self.batcher.run(),
            self.telemetry.run(),
            loops.listen(self),
            loops.poll(self),
            loops.expire(self),
            loops.announce(self),
        ]

    async def stopped(self) -> None:
        """Once the server has stopped: its streams' sessions closed, their last beats
        renewing their leases."""
        await self.sessions.settled()
        await self.batcher.flush()
        await self.telemetry.flush()
