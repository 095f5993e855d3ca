"""Simulated nodes for `make bench`: N mutual-TLS NodeControl streams from one process.

Standalone (grpc.aio, no Django), so the load it makes costs the server under
test nothing but the streams themselves::

    python -m tests.bench.gateway_load --target 127.0.0.1:8443 --credentials nodes.json

``nodes.json`` is ``{"ca": PEM, "nodes": [{"node_id", "key": PEM, "cert": PEM}, ...]}``.
Each node gets its own channel and its own client certificate, so every stream
costs the server a real TLS handshake. Three phases:

1. ramp: at most ``--ramp-concurrency`` opens (TLS handshake, Hello, Welcome)
   in flight at once, so the server is never stampeded; or, with
   ``--arrive-within S``, a cold start: each node opens at a random moment of the
   first S seconds, however many are in flight. Each stream heartbeats
   from its Welcome on, as a real agent does: a node silent for a long ramp
   would outlive its lease;
2. steady window, after ``--warmup`` seconds (one interval by default: every
   stream's first heartbeat, which may cost the server per-session work, is
   behind it): every stream heartbeats every ``--interval`` seconds with a
   random phase; each ack's latency is recorded;
3. saturation window: every stream sends its next heartbeat as soon as the
   previous one is acked. At a fixed interval any server acks N/interval per
   second; this is the figure that tells two servers apart.

Progress goes to stderr; the result is one JSON line on stdout.
"""

import argparse
import asyncio
import json
import random
import resource
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc

from nodes.agent.proto import control_pb2 as pb
from nodes.agent.proto import control_pb2_grpc
from nodes.agent.serve import CHANNEL_OPTIONS, backoff_delay
from tests.bench.collector import Collections
from tests.bench.gateway_report import gc_pauses

OPEN_TIMEOUT_SECONDS = 120
ACK_TIMEOUT_SECONDS = 30


class StreamLost(Exception):
    """The server ended a stream the generator still meant to use."""


def raise_fd_limit() -> None:
    """One socket per stream: the soft limit (often 1024) would cap N long before the server."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def percentile_ms(ordered: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an already sorted list of seconds, in milliseconds."""
    if not ordered:
        return None
    return round(1000 * ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))], 2)


@dataclass
class Window:
    """The acks received inside one measured window."""

    name: str
    started: float = 0.0  # epoch seconds, so the caller can line them up with its own samples
    ended: float = 0.0
    cpu: float = 0.0
    latencies: list[float] = field(default_factory=list)

    def open(self) -> None:
        self.started, self.cpu = time.time(), time.process_time()

    def close(self) -> None:
        self.ended, self.cpu = time.time(), time.process_time() - self.cpu

    def figures(self) -> dict:
        ordered = sorted(self.latencies)
        seconds = self.ended - self.started
        return {
            f"{self.name}window": [self.started, self.ended],
            f"{self.name}heartbeats_acked": len(ordered),
            f"{self.name}heartbeats_per_second": round(len(ordered) / seconds, 1),
            f"{self.name}p50_ms": percentile_ms(ordered, 0.50),
            f"{self.name}p99_ms": percentile_ms(ordered, 0.99),
            f"{self.name}max_ms": percentile_ms(ordered, 1.0),
            f"{self.name}client_cpu_percent": round(100 * self.cpu / seconds, 1),
        }


class Clock:
    """The phase every stream follows: ramp → steady → saturate → stop."""

    def __init__(self, expected: int):
        self.expected = expected
        self.started = time.perf_counter()
        self.held = 0
        self.failed = 0
        self.all_arrived = asyncio.Event()
        self.open_latencies: list[float] = []
        self.retried: Counter = Counter()
        # How long each failed open had run when it failed: the server gave up at once, or
        # late (a timeout), says which (README, "A gateway at fleet scale").
        self.failed_after: list[float] = []
        # Set when heartbeats stop following the interval, to wake streams sleeping on it.
        self.paced_no_more = asyncio.Event()
        self.recording: Window | None = None
        self.saturating = False
        self.stopped = False

    def arrived(self, welcomed: bool) -> None:
        if welcomed:
            self.held += 1
        else:
            self.failed += 1
        done = self.held + self.failed
        if done % 1000 == 0 or done == self.expected:
            print(
                f"ramp: {self.held} held, {self.failed} failed, "
                f"{time.perf_counter() - self.started:.0f} s",
                file=sys.stderr,
                flush=True,
            )
        if done == self.expected:
            self.all_arrived.set()

    def saturate(self, window: Window) -> None:
        self.recording, self.saturating = window, True
        self.paced_no_more.set()

    def stop(self) -> None:
        self.recording, self.stopped = None, True
        self.paced_no_more.set()

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until ``deadline`` (loop time), or until pacing ends."""
        try:
            async with asyncio.timeout_at(deadline):
                await self.paced_no_more.wait()
        except TimeoutError:
            pass


class SimulatedNode:
    """One node's stream: Hello, Welcome, then heartbeats with strictly increasing sequence."""

    def __init__(self, target: str, ca: bytes, node: dict):
        self.node_id, self.target = node["node_id"], target
        self.credentials = grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=node["key"].encode(),
            certificate_chain=node["cert"].encode(),
        )
        self.channel = self._channel()
        self.call = None
        self.sequence = 0

    def _channel(self):
        # A subchannel pool of its own: no chance of two nodes sharing one connection.
        return grpc.aio.secure_channel(  # the agent's channel, one per stream
            self.target,
            self.credentials,
            options=[("grpc.use_local_subchannel_pool", 1), *CHANNEL_OPTIONS],
        )

    async def reset(self) -> None:
        """After a failed open, as the agent does: a new channel for the next attempt."""
        await self.channel.close()
        self.channel, self.sequence = self._channel(), 0

    async def open(self) -> None:
        self.call = control_pb2_grpc.NodeControlStub(self.channel).Connect()
        await self.call.write(
            pb.NodeMessage(hello=pb.Hello(node_id=self.node_id, agent_version="bench"))
        )
        await self._read_until("welcome")

    async def beat(self) -> float:
        """One heartbeat; the seconds until its ack."""
        self.sequence += 1
        sent = time.perf_counter()
        await self.call.write(
            pb.NodeMessage(
                heartbeat=pb.Heartbeat(sequence=self.sequence, storage_root_visible=True)
            )
        )
        while (await self._read_until("heartbeat_ack")).heartbeat_ack.sequence != self.sequence:
            pass
        return time.perf_counter() - sent

    async def _read_until(self, kind: str) -> pb.ControlMessage:
        # The server may send what this generator does not measure (commands...): skipped.
        while True:
            message = await self.call.read()
            if message is grpc.aio.EOF:
                raise StreamLost(f"stream ended while waiting for {kind}")
            if message.WhichOneof("body") == kind:
                return message

    async def close(self) -> None:
        await self.channel.close()


async def live(
    node: SimulatedNode,
    opens: asyncio.Semaphore,
    clock: Clock,
    interval: float,
    errors: Counter,
    arrive_at: float = 0.0,
) -> None:
    """A node's whole life: open (bounded by ``opens``, ``arrive_at`` seconds after the
    start), heartbeat as the clock says, close."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(arrive_at)
    try:
        async with asyncio.timeout(OPEN_TIMEOUT_SECONDS):
            await opened(node, opens, clock, retry=arrive_at > 0)
    except (grpc.aio.AioRpcError, StreamLost, TimeoutError) as error:
        errors[f"open: {describe(error)}"] += 1
        clock.arrived(False)
        await node.close()
        return
    clock.arrived(True)
    next_beat = loop.time() + random.uniform(0, interval)
    try:
        while not clock.stopped:
            if not clock.saturating:
                await clock.sleep_until(next_beat)
                if clock.stopped:
                    break
                next_beat = max(next_beat + interval, loop.time())
            async with asyncio.timeout(ACK_TIMEOUT_SECONDS):
                latency = await node.beat()
            # Counted when acked, not when sent: the burst of sends that opens the
            # saturation window would otherwise count as throughput.
            if clock.recording is not None:
                clock.recording.latencies.append(latency)
    except (grpc.aio.AioRpcError, StreamLost, TimeoutError) as error:
        errors[f"heartbeat: {describe(error)}"] += 1
    finally:
        await node.close()


async def opened(node: SimulatedNode, opens: asyncio.Semaphore, clock: Clock, retry: bool):
    """Open the node's stream; in a cold start (``retry``), a failed open is tried again
    after the agent's own backoff, as the agent does, until OPEN_TIMEOUT_SECONDS."""
    attempt = 0
    while True:
        try:
            async with opens:
                # Timed from the start of the open, not from joining the queue for ``opens``.
                started = time.perf_counter()
                await node.open()
                clock.open_latencies.append(time.perf_counter() - started)
                return
        except (grpc.aio.AioRpcError, StreamLost) as error:
            if not retry:
                raise
            clock.retried[f"open: {describe(error)}"] += 1
            clock.failed_after.append(time.perf_counter() - started)
            attempt += 1
            await node.reset()
            await asyncio.sleep(backoff_delay(attempt, 0))


async def gc_counts(metrics: str | None) -> dict | None:
    """The server's garbage collections so far, from its /metrics, when it serves them."""
    if not metrics:
        return None
    return await asyncio.get_running_loop().run_in_executor(None, gc_pauses, metrics)


def subtract(after: dict | None, before: dict | None) -> dict | None:
    if after is None or before is None:
        return None
    return {
        key: {g: n - before[key].get(g, 0) for g, n in counts.items()}
        for key, counts in after.items()
    }


def describe(error: Exception) -> str:
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name} {error.details()}"[:120]
    return type(error).__name__ if isinstance(error, TimeoutError) else str(error)


async def run(args) -> dict:
    with open(args.credentials) as handle:
        bundle = json.load(handle)
    ca = bundle["ca"].encode()
    nodes = [SimulatedNode(args.target, ca, node) for node in bundle["nodes"][: args.streams]]
    clock, errors = Clock(len(nodes)), Counter()
    cold = args.arrive_within > 0
    opens = asyncio.Semaphore(len(nodes) if cold else args.ramp_concurrency)
    lives = [
        asyncio.create_task(
            live(
                node,
                opens,
                clock,
                args.interval,
                errors,
                random.uniform(0, args.arrive_within) if cold else 0.0,
            )
        )
        for node in nodes
    ]
    await clock.all_arrived.wait()
    ramp_seconds = time.perf_counter() - clock.started
    held = clock.held
    # The streams' objects live until the end: the collector's passes over them would be
    # counted as the server's ack latency.
    Collections.freeze()

    await asyncio.sleep(args.warmup)
    steady, saturation = Window(""), Window("saturation_")
    collections = await gc_counts(args.metrics)
    clock.recording = steady
    steady.open()
    await asyncio.sleep(args.window)
    steady.close()
    collections_in_window = subtract(await gc_counts(args.metrics), collections)
    print("steady window done", file=sys.stderr, flush=True)
    clock.saturate(saturation)
    saturation.open()
    await asyncio.sleep(args.saturate)
    saturation.close()
    # Streams lost before the end are counted as errors; the gauge is taken before closing.
    still_open = sum(1 for task in lives if not task.done())
    clock.stop()
    await asyncio.gather(*lives)
    return {
        "streams_requested": len(nodes),
        "streams_held": held,
        "streams_open_at_end": still_open,
        "ramp_seconds": round(ramp_seconds, 2),
        "ramp_concurrency": None if cold else args.ramp_concurrency,
        "arrive_within_seconds": args.arrive_within,
        "open_p50_ms": percentile_ms(sorted(clock.open_latencies), 0.50),
        "open_p99_ms": percentile_ms(sorted(clock.open_latencies), 0.99),
        "open_retries": dict(clock.retried),
        "open_failed_after_p50_ms": percentile_ms(sorted(clock.failed_after), 0.50),
        "open_failed_after_max_ms": percentile_ms(sorted(clock.failed_after), 1.0),
        "window_gc": collections_in_window,
        "interval_seconds": args.interval,
        "warmup_seconds": args.warmup,
        **steady.figures(),
        **saturation.figures(),
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "client_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True, help="HOST:PORT of the NodeControl server")
    parser.add_argument("--credentials", required=True, help="the nodes' JSON bundle")
    parser.add_argument("--streams", type=int, default=None, help="at most this many nodes")
    parser.add_argument("--interval", type=float, default=10.0, help="heartbeat seconds")
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="seconds between ramp and steady window (default: --interval)",
    )
    parser.add_argument("--window", type=float, default=60.0, help="steady window seconds")
    parser.add_argument("--saturate", type=float, default=10.0, help="saturation window seconds")
    parser.add_argument(
        "--ramp-concurrency",
        type=int,
        default=20,
        help="stream opens (TLS handshake + Hello/Welcome) in flight at once",
    )
    parser.add_argument(
        "--arrive-within",
        type=float,
        default=0.0,
        help="a cold start: each node opens at a random moment of the first this many "
        "seconds, with no bound on opens in flight (default 0: --ramp-concurrency)",
    )
    parser.add_argument("--metrics", help="HOST:PORT of the server's /metrics, if it has one")
    args = parser.parse_args()
    if args.warmup is None:
        args.warmup = args.interval
    raise_fd_limit()
    print(json.dumps(asyncio.run(run(args))), flush=True)


if __name__ == "__main__":
    main()
