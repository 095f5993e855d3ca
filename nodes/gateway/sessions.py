"""Session opens and closes on one gateway replica, written in batches (group commit).

A Hello waits for its session; a stream that ended waits for its close. Each joins the
replica's queue, and one call on a database thread answers every one that arrived while the
previous call was running — at most ``OPEN_BATCH`` or ``CLOSE_BATCH`` — so a lone Hello
waits for one call and a reconnect storm of 10,000 for a few dozen (issue 20), where one
transaction each kept them waiting for minutes. Two Hellos of one node never share a batch:
the later one goes in the next, so the newer stream still replaces the older.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ..services import sessions
from .loops import deliver_pending
from .metrics import SESSION_BATCH

if TYPE_CHECKING:
    from .process import Gateway

logger = logging.getLogger("tuneplane.gateway")

OPEN_BATCH = 500
CLOSE_BATCH = 1000
# Said of a session opened for a stream whose Hello was abandoned while it waited.
ABANDONED = "stream ended before its Welcome"


class GroupCommit:
    """Items waiting for one batched call, by key. ``call`` takes the items of a batch (no
    two with one key) and answers each, in order, with a result or an exception. A worker
    task runs while items wait, and ends when none do."""

    def __init__(self, call: Callable[[list], Awaitable[list]], *, limit: int, kind: str):
        self.call, self.limit, self.kind = call, limit, kind
        self.waiting: deque = deque()
        self.worker: asyncio.Task | None = None
        # Told the items whose callers stopped waiting, with their results.
        self.abandoned: Callable[[list], None] = lambda pairs: None

    def submit(self, key, item) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((key, item, future))
        if self.worker is None or self.worker.done():
            self.worker = asyncio.create_task(self._drain())
        return future

    async def settled(self) -> None:
        """Once nothing waits: every item submitted so far has been written."""
        while self.worker is not None and not self.worker.done():
            await asyncio.wait([self.worker])

    def _next_batch(self) -> list:
        batch, later, keys = [], [], set()
        while self.waiting and len(batch) < self.limit:
            entry = self.waiting.popleft()
            (later if entry[0] in keys else batch).append(entry)
            keys.add(entry[0])
        self.waiting.extendleft(reversed(later))
        return batch

    async def _drain(self) -> None:
        while batch := self._next_batch():
            SESSION_BATCH.labels(self.kind).observe(len(batch))
            try:
                results = await self.call([item for _, item, _ in batch])
            except Exception as error:
                results = [error] * len(batch)
            gone = []
            for (_, item, future), result in zip(batch, results, strict=True):
                if future.done():  # its caller was cancelled: the peer left meanwhile
                    gone.append((item, result))
                elif isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)
            if gone:
                self.abandoned(gone)


class SessionBatches:
    """One replica's session opens and closes."""

    def __init__(self, gateway: Gateway):
        self.gateway = gateway
        self.opens = GroupCommit(self._open, limit=OPEN_BATCH, kind="open")
        self.opens.abandoned = self._close_abandoned
        self.closes = GroupCommit(self._close, limit=CLOSE_BATCH, kind="close")

    async def open(self, hello: sessions.Hello) -> sessions.Opened:
        """The node's new session and its pending commands; SessionRefused if it may not."""
        return await self.opens.submit(hello.node_id, hello)

    async def close(self, session_id: str, reason: str) -> None:
        await self.closes.submit(session_id, (session_id, reason))

    async def settled(self) -> None:
        """A stopping replica's last opens and closes written (the closes of the streams its
        stop ended, among them)."""
        await asyncio.sleep(0)  # the closes that streams ending just now are about to submit
        await self.opens.settled()
        await self.closes.settled()

    async def _open(self, hellos: list[sessions.Hello]) -> list:
        database, name = self.gateway.database, self.gateway.name
        try:
            answers = await database.run(
                sessions.sessions_open, hellos=hellos, gateway=name, sessions=True
            )
        except Exception:
            if len(hellos) == 1:
                raise
            # One Hello's trouble (a deadlock, say) fails only that Hello.
            logger.exception("opening %d sessions failed; opening them one by one", len(hellos))
            answers = {}
            for hello in hellos:
                try:
                    answers |= await database.run(
                        sessions.sessions_open, hellos=[hello], gateway=name, sessions=True
                    )
                except Exception as error:
                    answers[hello.node_id] = error
        # Once the waiting Connects have taken their streams: a command created while the
        # batch was written, whose nudge found no stream yet, is delivered now.
        opened = [node for node, answer in answers.items() if isinstance(answer, sessions.Opened)]
        if opened:
            asyncio.get_running_loop().call_soon(self._deliver_after_open, opened)
        return [answers[hello.node_id] for hello in hellos]

    def _deliver_after_open(self, node_ids: list[str]) -> None:
        async def deliver():
            try:
                await deliver_pending(self.gateway, node_ids=node_ids)
            except Exception:  # the poll delivers it in a moment
                logger.exception("delivering after %d session opens failed", len(node_ids))

        task = asyncio.create_task(deliver())
        self.gateway.storing.add(task)
        task.add_done_callback(self.gateway.storing.discard)

    def _close_abandoned(self, gone: list) -> None:
        for _, answer in gone:
            if isinstance(answer, sessions.Opened):
                session_id = str(answer.session.pk)
                self.closes.submit(session_id, (session_id, ABANDONED))

    async def _close(self, ended: list[tuple[str, str]]) -> list:
        await self.gateway.database.run(sessions.sessions_close, ended=dict(ended), sessions=True)
        return [None] * len(ended)
