"""Simulated nodes for the telemetry bench: N mutual-TLS NodeControl streams, then three
windows of equal length — quiet (streams open, nothing sent), heartbeats only, telemetry
only (one sample of eight cards per stream per interval) — so the gateway's CPU in each,
less the quiet one, is the cost of that kind of message alone. Each stream's first
heartbeat and first sample are sent before the windows::

    python -m tests.bench.telemetry_load --target HOST:PORT --credentials nodes.json

Progress goes to stderr; the result is one JSON line on stdout: each window's start and end
(epoch seconds) and the messages sent in it.
"""

import argparse
import asyncio
import json
import random
import sys
import time

import grpc

from nodes.agent import wire

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
        async with opens:
            await node.open()

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
    args = parser.parse_args()
    raise_fd_limit()
    try:
        print(json.dumps(asyncio.run(run(args))), flush=True)
    except grpc.aio.AioRpcError as error:
        print(f"stream failed: {error.code().name} {error.details()}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
