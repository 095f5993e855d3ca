"""A gateway replica's database threads: each runs control services with a connection of its
own, so the event loop never waits on the database."""

import asyncio
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from django.conf import settings
from django.db import close_old_connections, connection


def _call(function, *args, **kwargs):
    """Connections are kept as ``CONN_MAX_AGE`` says and checked before use, so one that died
    is replaced."""
    close_old_connections()
    try:
        return function(*args, **kwargs)
    finally:
        close_old_connections()


class DatabaseThreads:
    """The threads that run one replica's database work, each with its own connection; a
    thread of its own for what says the replica is alive — its announcements and its lease
    flushes — so a reconnect storm queued on the others never makes a working replica look
    silent; and one for the batches of session opens and closes, so a Hello never waits
    behind the reports of streams already open (issue 20). SQLite has one writer at a time:
    one thread there, for all three.

    ``pool`` and ``control_pool`` are for tests that need threads of their own (sessions
    then share ``pool``)."""

    def __init__(
        self,
        threads: int | None = None,
        *,
        pool: ThreadPoolExecutor | None = None,
        control_pool: ThreadPoolExecutor | None = None,
    ):
        sqlite = connection.vendor == "sqlite"
        self.pool = pool or ThreadPoolExecutor(
            1 if sqlite else threads or settings.TUNEPLANE_GATEWAY_DB_THREADS,
            thread_name_prefix="gateway-db",
        )
        self.control_pool = control_pool or (
            self.pool if sqlite else ThreadPoolExecutor(1, thread_name_prefix="gateway-control")
        )
        self.sessions_pool = (
            self.pool
            if sqlite or pool is not None
            else ThreadPoolExecutor(1, thread_name_prefix="gateway-sessions")
        )

    async def run(
        self, function, /, *args, control: bool = False, sessions: bool = False, **kwargs
    ):
        """Run a control service on a database thread (``control``: the liveness thread;
        ``sessions``: the thread of session batches)."""
        executor = self.control_pool if control else self.sessions_pool if sessions else self.pool
        return await asyncio.get_running_loop().run_in_executor(
            executor, partial(_call, function, *args, **kwargs)
        )

    def waiting(self) -> int:
        """Calls queued for a thread, not yet running (the metrics' database queue depth)."""
        pools = {self.pool, self.control_pool, self.sessions_pool}
        return sum(pool._work_queue.qsize() for pool in pools)

    def shutdown(self) -> None:
        for pool in {self.pool, self.control_pool, self.sessions_pool}:
            pool.shutdown(wait=True)
