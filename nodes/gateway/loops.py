"""What a gateway replica runs beside its streams: it listens for events from the rest of the
console, polls for pending commands, announces that it is alive, and closes silent streams."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import redis.asyncio
from django.conf import settings

from .. import bus, selectors
from ..services import control, logs
from .streams import expire_pass

if TYPE_CHECKING:
    from .process import Gateway

logger = logging.getLogger("tuneplane.gateway")


async def deliver_pending(gateway: Gateway, /, **which) -> int:
    """Send the pending commands, and requests for members' output, of the nodes whose
    streams this replica holds."""
    pending = await gateway.database.run(selectors.commands_pending, **which)
    fetches = await gateway.database.run(logs.log_fetches_pending, **which)
    by_node: dict[str, list] = {}
    for command in pending:
        by_node.setdefault(command.node_id, []).append(command)
    for fetch in fetches:
        stream = gateway.streams.by_node.get(fetch.node_id)
        if stream is not None:
            stream.ask_for_log(fetch)
    return sum(
        stream.deliver(by_node[node_id])
        for node_id, stream in list(gateway.streams.by_node.items())
        if node_id in by_node
    )


async def on_event(gateway: Gateway, event: dict) -> None:
    if event["node"] not in gateway.streams.by_node:
        return
    if event["type"] == bus.COMMANDS:
        await deliver_pending(gateway, node_id=event["node"])
    elif event["type"] == bus.CLOSE:
        gateway.streams.close(
            event["node"], str(event.get("reason") or "closed by the console")[:200]
        )


async def listen(gateway: Gateway) -> None:
    """Events from every replica, web and worker through Redis; reconnects by itself."""
    if not settings.REDIS_URL:
        return
    delay = 1
    while True:
        try:
            async with (
                redis.asyncio.Redis.from_url(settings.REDIS_URL) as client,
                client.pubsub() as pubsub,
            ):
                await pubsub.subscribe(bus.CHANNEL)
                logger.info("listening for node-control events")
                delay = 1
                await deliver_pending(gateway, gateway=gateway.name)  # what was missed
                async for message in pubsub.listen():
                    event = bus.parse(message["data"]) if message["type"] == "message" else None
                    if event is not None:
                        await on_event(gateway, event)
        except (redis.RedisError, OSError) as error:
            logger.warning("node-control events unavailable (%s); retrying in %ds", error, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30)


async def announce(gateway: Gateway) -> None:
    """This replica is listening: said at start, then every half heartbeat interval, so the
    liveness sweep can tell a console that heard nothing from nodes that said nothing. A
    lease after the start, the sessions a killed predecessor left open are closed."""
    started = None
    left_open_due = time.monotonic() + settings.TUNEPLANE_LEASE_TTL
    while True:
        try:
            if started is None:
                replica = await gateway.database.run(
                    control.gateway_started, name=gateway.name, control=True
                )
                started = replica.started_at
            else:
                await gateway.database.run(
                    control.gateway_alive, name=gateway.name, started_at=started, control=True
                )
            if left_open_due is not None and time.monotonic() >= left_open_due:
                await gateway.database.run(
                    control.sessions_left_open_close,
                    gateway=gateway.name,
                    serving_since=gateway.serving_since,
                    control=True,
                )
                left_open_due = None
        except Exception:  # the database is away: the sweep holds its judgement meanwhile
            logger.exception("announcing this gateway replica failed")
        await asyncio.sleep(max(settings.TUNEPLANE_HEARTBEAT_INTERVAL / 2, 1))


async def poll(gateway: Gateway) -> None:
    """The record, not the nudge: pending commands for this replica's nodes, one statement
    per interval whatever the number of nodes."""
    while True:
        await asyncio.sleep(settings.TUNEPLANE_COMMAND_POLL_INTERVAL)
        try:
            await deliver_pending(gateway, gateway=gateway.name)
        except Exception:
            logger.exception("polling for pending commands failed")


async def expire(gateway: Gateway) -> None:
    """One pass a second over every stream."""
    due = time.monotonic() + 1
    while True:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        now = time.monotonic()
        expire_pass(gateway.streams, now=now, late=now - due)
        due = now + 1
