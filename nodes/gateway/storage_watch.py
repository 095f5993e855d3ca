"""L6 from one stream, debounced. A node's certificate sits on a machine we do not control:
toggling the storage-root flag in every heartbeat must not move the system cordon (and write
its audit event) every time. The cordon moves at most once a lease per node; between moves
the latest state wins, and is what the next move writes."""

import asyncio
import time
from collections.abc import Callable

from django.conf import settings


class StorageWatch:
    """``watching``: whether the node's Fleet watches its storage root at all (a node whose
    Fleet does not is never written for it). ``recorded``: the state the console holds from
    an earlier stream — a beat that agrees with it writes nothing; one that does not, at
    once."""

    def __init__(
        self,
        enqueue: Callable[[], None],
        *,
        watching: bool = True,
        recorded: bool | None = None,
    ):
        self.enqueue = enqueue  # puts one storage observation on the stream's database queue
        self.watching = watching
        self.latest: bool | None = None
        self.written: bool | None = recorded
        self.written_at = float("-inf")
        self.queued = False
        self.timer: asyncio.TimerHandle | None = None
        self.reported = False  # an inventory report on this stream wrote the state itself

    def observe(self, visible: bool) -> None:
        self.latest = visible
        if not self.watching:
            return
        if self.queued or self.timer is not None or visible == self.written:
            return
        wait = self.written_at + settings.TUNEPLANE_LEASE_TTL - time.monotonic()
        if wait <= 0:
            self._due()
        else:
            self.timer = asyncio.get_running_loop().call_later(wait, self._due)

    def _due(self) -> None:
        self.timer = None
        if self.latest != self.written:
            self.queued = True
            self.enqueue()

    def take(self) -> bool:
        """The state to write now, by the database queue's turn: the latest observed."""
        self.queued = False
        self.written, self.written_at = self.latest, time.monotonic()
        return self.latest

    def settled(self, visible: bool) -> None:
        """An inventory report wrote this state itself (its first on the stream)."""
        self.written, self.written_at, self.reported = visible, time.monotonic(), True

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
