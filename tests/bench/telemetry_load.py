"""Simulated nodes for the telemetry bench: N mutual-TLS NodeControl streams, then four
windows of equal length — quiet (streams open, nothing sent), heartbeats only, telemetry
only (one sample of eight cards per stream per interval: every sample sent, the worst case)
and telemetry reported (each node runs the agent's own Reporter over a synthetic workload and
sends what it decides) — so the gateway's CPU in each, less the quiet one, is the cost of
that kind of message alone. Each stream's first heartbeat and first sample are sent before
the windows::

    python -m tests.bench.telemetry_load --target HOST:PORT --credentials nodes.json

In the reported window time is compressed: each node takes a sample every ``--tick``
seconds, each standing for one production interval (15 s), so the window covers more than
one refresh period. The workload (Workload): half the nodes idle, half busy, each figure
jittering inside its deadband about its phase's level; a node changes phase (a job starts or
ends) PHASE_CHANGES_PER_HOUR on average; SWINGING of the nodes run work whose utilisation
swings beyond the deadband at every sample.

Progress goes to stderr; the result is one JSON line on stdout: each window's start and end
(epoch seconds) and the messages sent in it (and, for the reported one, the samples taken).
"""

import argparse
import asyncio
import json
import random
import sys
import time

import grpc

from nodes.agent import telemetry, wire
from nodes.agent.serve import backoff_delay

from .gateway_load import SimulatedNode, raise_fd_limit

CARDS = [
    {
        "index": i,
        "uuid": f"GPU-{i:05d}-bench",
        "name": "NVIDIA H100 80GB HBM3",
        "utilization_percent": 87.5,
        "memory_used_bytes": 61 * 2**30,
        "memory_total_bytes": 80 * 2**30,
        "temperature_celsius": 71.0,
        "power_watts": 612.4,
        "ecc_corrected": 3,
        "ecc_uncorrected": 0,
        "xid_counts": {},
    }
    for i in range(8)
]
SAMPLE = wire.telemetry_message(
    {
        "source": "nvml",
        "cards": CARDS,
        "cpu_percent": 40.0,
        "memory_used_bytes": 2**38,
        "memory_total_bytes": 2**39,
    }
)


OPEN_ATTEMPTS = 5
PRODUCTION_INTERVAL = 15.0  # TUNEPLANE_TELEMETRY_INTERVAL: what one tick stands for
PHASE_CHANGES_PER_HOUR = 2.0  # a job starting or ending every half hour, per node
SWINGING = 0.05  # of the nodes: utilisation beyond the deadband at every sample
GIB = 2**30
# Each phase's level; the jitter about it is under half of each deadband (telemetry.py), so
# a steady node's samples never differ from its last sent one by a whole deadband.
LEVELS = {
    "idle": {"utilization_percent": 0.0, "memory_used_bytes": GIB // 2,
             "temperature_celsius": 34.0, "power_watts": 70.0, "cpu_percent": 3.0},
    "busy": {"utilization_percent": 95.0, "memory_used_bytes": 70 * GIB,
             "temperature_celsius": 72.0, "power_watts": 650.0, "cpu_percent": 60.0},
}  # fmt: skip


class Workload:
    """One node's cards and host over time, sampled as the agent samples them."""

    def __init__(self, swinging: bool):
        self.phase = random.choice(sorted(LEVELS))
        self.swinging = swinging

    def sample(self) -> dict:
        if random.random() < PHASE_CHANGES_PER_HOUR * PRODUCTION_INTERVAL / 3600:
            self.phase = "busy" if self.phase == "idle" else "idle"
        level = LEVELS[self.phase]

        def about(value: float, spread: float, top: float = float("inf")) -> float:
            return min(max(value + random.uniform(-spread, spread), 0.0), top)

        cards = []
        for card in CARDS:
            used = about(level["memory_used_bytes"], 0.015 * card["memory_total_bytes"])
            utilization = (
                random.uniform(0, 100)
                if self.swinging
                else about(level["utilization_percent"], 4.0, 100.0)
            )
            cards.append(
                {
                    **card,
                    "utilization_percent": round(utilization, 1),
                    "memory_used_bytes": int(used),
                    "temperature_celsius": round(about(level["temperature_celsius"], 2.0)),
                    "power_watts": round(about(level["power_watts"], 0.04 * level["power_watts"])),
                }
            )
        return {
            "source": "nvml",
            "cards": cards,
            "cpu_percent": round(about(level["cpu_percent"], 4.0, 100.0), 1),
            "memory_used_bytes": int(about(2**38, 0.02 * 2**39)),
            "memory_total_bytes": 2**39,
        }


async def paced(nodes, interval: float, window: float, send) -> int:
    """Every node sends once per interval, at a random phase, for the window."""
    sent = 0
    end = time.monotonic() + window

    async def one(node):
        nonlocal sent
        next_at = time.monotonic() + random.uniform(0, interval)
        while True:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            if time.monotonic() >= end:
                return
            await send(node)
            sent += 1
            next_at += interval

    await asyncio.gather(*(one(node) for node in nodes))
    return sent


async def run(args) -> dict:
    with open(args.credentials) as handle:
        bundle = json.load(handle)
    ca = bundle["ca"].encode()
    nodes = [SimulatedNode(args.target, ca, node) for node in bundle["nodes"][: args.streams]]
    opens = asyncio.Semaphore(20)

    async def open_one(node):
        # On a loaded machine an open may be turned away: tried again as the agent does.
        for attempt in range(1, OPEN_ATTEMPTS + 1):
            try:
                async with opens:
                    await node.open()
                return
            except grpc.aio.AioRpcError:
                if attempt == OPEN_ATTEMPTS:
                    raise
                await node.reset()
                await asyncio.sleep(backoff_delay(attempt, 0))

    await asyncio.gather(*(open_one(node) for node in nodes))
    print(f"{len(nodes)} streams open", file=sys.stderr, flush=True)
    # A stream's first heartbeat and first sample cost the gateway once per session (its
    # storage observation; its telemetry row inserted): behind us before anything is measured.
    for node in nodes:
        await node.call.write(SAMPLE)
    await asyncio.gather(*(node.beat() for node in nodes))
    await asyncio.sleep(args.settle)
    windows = {}
    started = time.time()
    await asyncio.sleep(args.window)
    windows["quiet"] = {"start": started, "end": time.time(), "messages": 0}

    async def beat(node):
        await node.beat()

    async def sample(node):
        await node.call.write(SAMPLE)

    for name, send in (("heartbeats", beat), ("telemetry", sample)):
        started = time.time()
        sent = await paced(nodes, args.interval, args.window, send)
        windows[name] = {"start": started, "end": time.time(), "messages": sent}
        print(f"{name}: {sent} sent", file=sys.stderr, flush=True)
        await asyncio.sleep(args.settle)  # the last batch flushed before the next window

    # Each node's Reporter as its stream's first sample left it, at a random point of its
    # refresh period (nodes joined at different times): no refresh in step with the others.
    refresh = wire.TELEMETRY_REFRESH_INTERVALS * PRODUCTION_INTERVAL
    state = {}
    for node in nodes:
        workload = Workload(swinging=random.random() < SWINGING)
        reporter = telemetry.Reporter(PRODUCTION_INTERVAL)
        reporter.due(workload.sample(), -random.uniform(0, refresh))
        state[node.node_id] = [workload, reporter, 0]
    reported = 0

    async def report(node):
        nonlocal reported
        one = state[node.node_id]
        one[2] += 1  # this node's tick: one production interval later
        taken = one[0].sample()
        if one[1].due(taken, one[2] * PRODUCTION_INTERVAL):
            reported += 1
            await node.call.write(wire.telemetry_message(taken))

    started = time.time()
    taken = await paced(nodes, args.tick, args.window, report)
    windows["reported"] = {
        "start": started, "end": time.time(), "messages": reported, "samples": taken,
        "swinging": SWINGING, "phase_changes_per_hour": PHASE_CHANGES_PER_HOUR,
    }  # fmt: skip
    print(f"reported: {reported} sent of {taken} taken", file=sys.stderr, flush=True)
    await asyncio.sleep(args.settle)
    for node in nodes:
        await node.close()
    return {"streams": len(nodes), "interval": args.interval, "windows": windows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--credentials", required=True)
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--tick", type=float, default=0.5, help="wall seconds per 15 s")
    args = parser.parse_args()
    raise_fd_limit()
    try:
        print(json.dumps(asyncio.run(run(args))), flush=True)
    except grpc.aio.AioRpcError as error:
        print(f"stream failed: {error.code().name} {error.details()}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
