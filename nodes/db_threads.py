"""The gateway's database threads: each runs control services with a connection of its own,
so the event loop never waits on the database."""

import asyncio
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from django.conf import settings
from django.db import close_old_connections, connection

_pool: ThreadPoolExecutor | None = None
_control_pool: ThreadPoolExecutor | None = None


def database_threads() -> ThreadPoolExecutor:
    """The threads that run the gateway's database work, each with its own connection.
    SQLite has one writer at a time, so one thread there."""
    global _pool
    if _pool is None:
        threads = 1 if connection.vendor == "sqlite" else settings.TUNEPLANE_GATEWAY_DB_THREADS
        _pool = ThreadPoolExecutor(threads, thread_name_prefix="gateway-db")
    return _pool


def control_thread() -> ThreadPoolExecutor:
    """A thread of its own for what says this replica is alive — its announcements and its
    lease flushes — so a reconnect storm queued on the others never makes a working replica
    look silent. SQLite's one writer: the same single thread there."""
    global _control_pool
    if connection.vendor == "sqlite":
        return database_threads()
    if _control_pool is None:
        _control_pool = ThreadPoolExecutor(1, thread_name_prefix="gateway-control")
    return _control_pool


def db(function, *, threads=database_threads):
    """Run a control service on a database thread. Connections are kept as
    ``CONN_MAX_AGE`` says and checked before use, so one that died is replaced."""
    def call(*args, **kwargs):
        close_old_connections()
        try:
            return function(*args, **kwargs)
        finally:
            close_old_connections()

    async def run(*args, **kwargs):
        return await asyncio.get_running_loop().run_in_executor(
            threads(), partial(call, *args, **kwargs))
    return run
