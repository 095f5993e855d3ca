"""A gateway replica keeps every stream of a reconnect storm that arrives faster than its
event loop takes them (issue 20).

grpc core holds a call whose headers have arrived until the application asks for it, and
grpc.aio asks for one at a time. With core's defaults, past 1,000 held calls it ends new
ones at random with CANCELLED, and every one past 3,000, before the application has seen
them: in a 10,000-node restart each such node went back through another TLS handshake.
``grpcserve``'s server options raise both limits, and the time a call may wait (core's
30 s). Here a grpc.aio server's loop is held busy while thousands of calls arrive, as the
gateway's is in a storm.
"""

import asyncio
import threading
import time
from collections import Counter
from contextlib import contextmanager

import grpc

from nodes.management.commands.grpcserve import PENDING_CALLS, SERVER_OPTIONS

CALLS = 3000
CHANNELS = 10
HELD_AFTER_SENT_SECONDS = 3
METHOD = "/backlog.Backlog/Echo"


async def echo(request, context):
    return request


@contextmanager
def aio_server(options):
    """A grpc.aio server on an event loop of its own thread; yields (loop, port)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start():
        server = grpc.aio.server(options=options)
        handlers = {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("backlog.Backlog", handlers),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    try:
        yield loop, port
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def storm_while_busy(options) -> Counter:
    """``CALLS`` calls arriving while the server's loop is held busy; how each ended."""
    released = threading.Event()
    with aio_server(options) as (loop, port):
        loop.call_soon_threadsafe(released.wait, 120)  # the loop is busy until released
        channels = [grpc.insecure_channel(f"127.0.0.1:{port}") for _ in range(CHANNELS)]
        try:
            calls = [
                channels[i % CHANNELS].unary_unary(METHOD).future(b"hello", timeout=120)
                for i in range(CALLS)
            ]
            time.sleep(HELD_AFTER_SENT_SECONDS)
            ended_while_busy = sum(call.done() for call in calls)
            released.set()
            outcomes = Counter(
                "ok" if call.exception() is None else call.code().name for call in calls
            )
        finally:
            released.set()
            for channel in channels:
                channel.close()
    outcomes["ended while busy"] = ended_while_busy
    return outcomes


def test_a_storm_past_cores_default_backlog_loses_no_stream():
    assert PENDING_CALLS >= 10_000  # a whole 10,000-node replica reconnecting at once

    outcomes = storm_while_busy(SERVER_OPTIONS)

    assert outcomes["ok"] == CALLS and outcomes["ended while busy"] == 0, outcomes


def test_with_cores_defaults_the_same_storm_loses_streams():
    """The control: the test above fails where the options are left out."""
    defaults = [option for option in SERVER_OPTIONS if "pending_requests" not in option[0]]

    outcomes = storm_while_busy(defaults)

    # Ended by core before the application could have seen them: its loop was busy.
    assert outcomes["ended while busy"] > 0 and outcomes["CANCELLED"] > 0, outcomes
    assert outcomes["ok"] + outcomes["CANCELLED"] == CALLS
