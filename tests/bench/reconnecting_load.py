"""Simulated nodes that come back, for `make bench`: N NodeControl streams from one process,
each reconnecting as ``tuneplane-node serve`` does when its gateway goes away.

Standalone (grpc.aio, no Django), run as a subprocess so its load is not the caller's::

    python -m tests.bench.reconnecting_load --target 127.0.0.1:8443 --credentials nodes.json

``nodes.json`` is ``gateway_load``'s bundle. Each node, like the real agent
(``nodes/agent/serve.py``):

- opens a stream on a channel of its own to one ``--target`` picked at random
  per connect: Hello carrying the commands it knows (CommandState), then Welcome;
- sends its inventory (unless the Welcome names it as held), then a heartbeat every
  interval the Welcome gives, each
  followed by CommandUpdates for commands whose state this stream has not told;
- on a command it does not know: records it (in memory, as the agent's state
  dir does), reports ``running`` and, a random while later, ``succeeded``. A
  command it knows is not run again: its state is told again, as the agent does;
- once a Welcome has followed a Hello that told a finished command, forgets it
  from later Hellos (the agent deletes its file): delivered again after that,
  the real agent would run it twice — counted as ``redelivered_after_forgotten``;
- when the stream ends, reconnects after the agent's own jittered exponential backoff
  (``nodes.agent.serve.backoff_delay``, capped by the interval its last Welcome gave).

Only the first open of each node is paced (``--ramp-concurrency``), to set the
fleet up; reconnects are paced by nothing but their backoff, as real agents'.
Every outage is recorded: when the stream ended, how many connects it took, when
the last of them began and when the next Welcome came. So is every stream the
console closed: its reason, how long it was held, the heartbeats sent on it and
the acks that came back. Runs until SIGTERM or SIGINT; progress goes to stderr,
the result is one JSON line on stdout.

A fleet of 10,000 is more than one event loop can play: after a gateway's SIGKILL, one
process took 20 s just to see all its streams end, which real machines each see at once.
``--shard I --shards K`` runs every Kth node from the Ith, so that K processes share the
fleet (``tests/bench/processes.py`` starts them and merges their results).
"""

import argparse
import asyncio
import json
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc

from nodes.agent.proto import control_pb2 as pb
from nodes.agent.proto import control_pb2_grpc
from nodes.agent.serve import (
    CHANNEL_OPTIONS,
    backoff_delay,
    inventory_digest,
    inventory_message,
)
from tests.bench.collector import Collections
from tests.bench.gateway_load import describe, raise_fd_limit

RUNNING, SUCCEEDED = "running", "succeeded"
PROGRESS_SECONDS = 5
LAG_TICK_SECONDS = 0.1
INVENTORY = inventory_message(
    {
        "cards": [{"name": "NVIDIA H100 80GB HBM3", "count": 8}],
        "driver": "550.54",
        "container_runtime": "docker 28.2.2",
        "storage_root_visible": True,
        "cpu_budget": 64,
        "memory_budget_bytes": 512 * 2**30,
    }
)
INVENTORY_DIGEST = inventory_digest(INVENTORY)


@dataclass
class Outage:
    """From a held stream's end to the next Welcome (None: still out when the fleet stopped)."""

    lost: float  # epoch seconds, so the caller can line them up with its own clock
    connects: int = 0
    last_connect: float | None = None  # when the connect that got the Welcome began
    welcomed: float | None = None


@dataclass
class Held:
    """One stream that got its Welcome: what went over it, and how it ended."""

    welcomed: float
    beats: int = 0
    acks: int = 0
    closed_by_console: str = ""  # the reason of the console's Close, if it sent one
    ended: float | None = None


@dataclass
class KnownCommand:
    """A command as the node's state dir holds it, and what befell it (for the record)."""

    state: str = RUNNING
    received: int = 1
    first_received: float = field(default_factory=time.time)  # epoch seconds
    in_hello: bool = True  # False once forgotten: the console has reconciled it finished
    redelivered_after_forgotten: int = 0
    updates: Counter = field(default_factory=Counter)  # CommandUpdates sent, by state
    history: list = field(default_factory=list)  # [epoch seconds, event, stream number]

    def note(self, event: str, stream: int) -> None:
        self.history.append([round(time.time(), 3), event, stream])


class Fleet:
    """What every node shares: the targets, the stop, the counts of how streams ended."""

    def __init__(self, args):
        self.args = args
        self.stopping = asyncio.Event()
        self.errors: Counter = Counter()
        # Opens that ended before their Welcome: by error, the seconds each had run, and
        # when each ended (epoch seconds).
        self.failed_opens: dict[str, list[float]] = {}
        self.failed_open_ends: dict[str, list[float]] = {}
        self.closed: list[Held] = []  # streams the console closed with a reason
        self.running: set[asyncio.Task] = set()  # commands being "run", kept from the collector
        self.loop_lag_max = 0.0
        # Since every node's first open was done: how late the loop ran, its collections.
        self.loop_lag_max_held = 0.0
        self.collections = Collections()

        self.heartbeat_interval = 0.0  # until a Welcome gives it, the agent's default cap

    def backoff(self, attempt: int) -> float:
        """The agent's: attempt 0 follows a stream that got a Welcome."""
        return backoff_delay(attempt, self.heartbeat_interval)


class SimulatedNode:
    def __init__(self, fleet: Fleet, ca: bytes, node: dict):
        self.fleet = fleet
        self.node_id = node["node_id"]
        self.credentials = grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=node["key"].encode(),
            certificate_chain=node["cert"].encode(),
        )
        self.known: dict[str, KnownCommand] = {}
        self.reported: dict[str, str] = {}  # what the current stream has told, by command
        self.streams = 0  # connects so far; the current one's number
        self.outages: list[Outage] = []
        self.held: Held | None = None
        self.first_welcome: float | None = None
        self.settled = asyncio.Event()  # the first open got a Welcome, or failed
        self.life: asyncio.Task | None = None

    async def live(self) -> None:
        attempt, outage = 0, None
        while True:
            if outage is not None:
                outage.connects += 1
                outage.last_connect = time.time()
            welcomed = await self.stream(random.choice(self.fleet.args.target), outage)
            self.settled.set()
            if welcomed:
                outage = Outage(lost=time.time())
                self.outages.append(outage)
            attempt = 0 if welcomed else attempt + 1
            await asyncio.sleep(self.fleet.backoff(attempt))

    async def stream(self, target: str, outage: Outage | None) -> bool:
        """One stream, until it ends. Returns whether it got as far as a Welcome."""
        self.streams += 1
        started = time.time()
        outgoing: asyncio.Queue = asyncio.Queue()
        told = {
            command_id: command.state
            for command_id, command in self.known.items()
            if command.in_hello
        }
        self.reported = dict(told)
        for command_id, state in told.items():
            self.known[command_id].note(f"told {state} in Hello", self.streams)
        outgoing.put_nowait(
            pb.NodeMessage(
                hello=pb.Hello(
                    node_id=self.node_id,
                    agent_version="bench-reconnecting",
                    commands=[
                        pb.CommandState(command_id=command_id, state=state, exit_code=0)
                        for command_id, state in told.items()
                    ],
                )
            )
        )

        async def requests():
            while (message := await outgoing.get()) is not None:
                yield message

        channel = grpc.aio.secure_channel(  # the agent's channel, one per stream
            target,
            self.credentials,
            options=[("grpc.use_local_subchannel_pool", 1), *CHANNEL_OPTIONS],
        )
        beating = None
        try:
            async for message in control_pb2_grpc.NodeControlStub(channel).Connect(requests()):
                kind = message.WhichOneof("body")
                if kind == "welcome":
                    self._welcomed(told, outage)
                    self.fleet.heartbeat_interval = message.welcome.heartbeat_interval_seconds
                    if message.welcome.inventory_digest != INVENTORY_DIGEST:  # as the agent
                        outgoing.put_nowait(pb.NodeMessage(inventory=INVENTORY))
                    beating = asyncio.create_task(
                        self._beat(outgoing, message.welcome.heartbeat_interval_seconds)
                    )
                elif kind == "heartbeat_ack":
                    self.held.acks += 1
                elif kind == "command":
                    self._accept(message.command, outgoing)
                elif kind == "close":
                    self.held.closed_by_console = message.close.reason
                    self.fleet.closed.append(self.held)
        except grpc.aio.AioRpcError as error:
            when = "stream" if self.held else "open"
            self.fleet.errors[f"{when}: {describe(error)}"] += 1
            if not self.held:
                ended, error_text = time.time(), describe(error)[:40]
                if error.code() == grpc.StatusCode.UNAVAILABLE:  # which connect failure
                    error_text = f"{error_text}: {error.details()[-60:]}"
                self.fleet.failed_opens.setdefault(error_text, []).append(round(ended - started, 2))
                self.fleet.failed_open_ends.setdefault(error_text, []).append(round(ended, 2))
        finally:
            if self.held is not None:
                self.held.ended = time.time()
            if beating is not None:
                beating.cancel()
            outgoing.put_nowait(None)
            await channel.close()
        welcomed, self.held = self.held is not None, None
        return welcomed

    def _welcomed(self, told: dict[str, str], outage: Outage | None) -> None:
        now = time.time()
        self.held = Held(welcomed=now)
        self.settled.set()
        if outage is None:
            self.first_welcome = self.first_welcome or now
        else:
            outage.welcomed = now
        # As the agent: finished commands this Hello told the console need not be told again.
        for command_id, state in told.items():
            if state != RUNNING:
                self.known[command_id].in_hello = False
                self.known[command_id].note("forgotten at Welcome", self.streams)

    def _accept(self, message: pb.Command, outgoing: asyncio.Queue) -> None:
        command = self.known.get(message.command_id)
        if command is None:
            command = self.known[message.command_id] = KnownCommand()
            task = asyncio.create_task(self._run(command))
            self.fleet.running.add(task)
            task.add_done_callback(self.fleet.running.discard)
        else:
            command.received += 1
            if not command.in_hello:
                command.redelivered_after_forgotten += 1
        command.note("received", self.streams)
        self._tell(message.command_id, outgoing)

    async def _run(self, command: KnownCommand) -> None:
        await asyncio.sleep(random.uniform(0, self.fleet.args.command_seconds))
        command.state = SUCCEEDED
        command.note("finished", self.streams)

    def _tell(self, command_id: str, outgoing: asyncio.Queue) -> None:
        command = self.known[command_id]
        self.reported[command_id] = command.state
        command.updates[command.state] += 1
        command.note(f"CommandUpdate {command.state}", self.streams)
        outgoing.put_nowait(
            pb.NodeMessage(
                command_update=pb.CommandUpdate(
                    state=pb.CommandState(command_id=command_id, state=command.state, exit_code=0)
                )
            )
        )

    async def _beat(self, outgoing: asyncio.Queue, interval: int) -> None:
        sequence = 0
        while True:
            await asyncio.sleep(interval)
            sequence += 1
            self.held.beats += 1
            outgoing.put_nowait(
                pb.NodeMessage(
                    heartbeat=pb.Heartbeat(
                        sequence=sequence,
                        storage_root_visible=True,
                        inventory_digest=INVENTORY_DIGEST,
                    )
                )
            )
            for command_id, command in self.known.items():
                if self.reported.get(command_id) not in (None, command.state):
                    self._tell(command_id, outgoing)


async def watch(fleet: Fleet, nodes: list[SimulatedNode], started: float) -> None:
    """Progress to stderr, and how late this loop runs its timers: a fleet that lags would
    be silent to the console for reasons of its own."""
    loop = asyncio.get_running_loop()
    next_report = loop.time() + PROGRESS_SECONDS
    lag_in_period = 0.0
    while True:
        due = loop.time() + LAG_TICK_SECONDS
        await asyncio.sleep(LAG_TICK_SECONDS)
        lag = loop.time() - due
        fleet.loop_lag_max = max(fleet.loop_lag_max, lag)
        if fleet.collections.counting:  # every node held
            fleet.loop_lag_max_held = max(fleet.loop_lag_max_held, lag)
        lag_in_period = max(lag_in_period, lag)
        if loop.time() >= next_report:
            next_report += PROGRESS_SECONDS
            held = sum(node.held is not None for node in nodes)
            closed = Counter(stream.closed_by_console for stream in fleet.closed)
            print(
                f"reconnecting fleet {fleet.args.shard + 1}/{fleet.args.shards}: {held} held, "
                f"{len(nodes) - held} out, "
                f"{time.time() - started:.0f} s; loop late by {lag_in_period:.2f} s at most "
                f"since the last line; closed by the console {dict(closed) or 0}",
                file=sys.stderr,
                flush=True,
            )
            lag_in_period = 0.0


async def run(args) -> dict:
    with open(args.credentials) as handle:
        bundle = json.load(handle)
    ca = bundle["ca"].encode()
    fleet = Fleet(args)
    mine = bundle["nodes"][: args.nodes][args.shard :: args.shards]
    nodes = [SimulatedNode(fleet, ca, node) for node in mine]
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, fleet.stopping.set)
    started = time.time()
    opens = asyncio.Semaphore(args.ramp_concurrency)

    async def first_open(node: SimulatedNode) -> None:
        async with opens:
            node.life = asyncio.create_task(node.live())
            await node.settled.wait()

    async def ramp_then_freeze() -> None:
        await asyncio.gather(*(first_open(node) for node in nodes))
        if args.freeze_when_held:
            fleet.collections.freeze()
        fleet.collections.counting = True

    watching = asyncio.create_task(watch(fleet, nodes, started))
    ramp = asyncio.ensure_future(ramp_then_freeze())
    await fleet.stopping.wait()
    held = sum(node.held is not None for node in nodes)
    lives = [node.life for node in nodes if node.life is not None]
    for task in [watching, ramp, *lives, *fleet.running]:
        task.cancel()
    await asyncio.gather(watching, ramp, *lives, return_exceptions=True)
    welcomes = [node.first_welcome for node in nodes if node.first_welcome]
    return {
        "nodes": len(nodes),
        "targets": args.target,
        "held_at_stop": held,
        "ramp_seconds": round(max(welcomes) - started, 2) if welcomes else None,
        "outages": [
            [node.node_id, outage.lost, outage.welcomed, outage.connects, outage.last_connect]
            for node in nodes
            for outage in node.outages
        ],
        "commands": [  # summed up by tests/bench/processes.py, over every shard
            {
                "node": node.node_id,
                "command": command_id,
                "received": command.received,
                "first_received": command.first_received,
                "state": command.state,
                "after_forgotten": command.redelivered_after_forgotten,
                "updates": command.updates,
                "history": command.history,
            }
            for node in nodes
            for command_id, command in node.known.items()
        ],
        "closed": [
            [held.closed_by_console, held.ended - held.welcomed, held.beats, held.acks]
            for held in fleet.closed
            if held.ended
        ],
        "errors": dict(fleet.errors),
        "failed_opens": fleet.failed_opens,
        "failed_open_ends": fleet.failed_open_ends,
        "loop_lag_max_seconds": round(fleet.loop_lag_max, 3),
        "held_loop_lag_max_seconds": round(fleet.loop_lag_max_held, 3),
        "held_gc_pause_max_seconds": round(fleet.collections.pause_max, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--target",
        required=True,
        action="append",
        help="HOST:PORT of a gateway replica; repeat for several",
    )
    parser.add_argument("--credentials", required=True, help="the nodes' JSON bundle")
    parser.add_argument("--nodes", type=int, default=None, help="at most this many nodes")
    parser.add_argument(
        "--shard",
        type=int,
        default=0,
        help="with --shards K: this process runs every Kth node from this one",
    )
    parser.add_argument("--shards", type=int, default=1, help="processes sharing the nodes")
    parser.add_argument(
        "--ramp-concurrency",
        type=int,
        default=20,
        help="first opens (TLS handshake + Hello/Welcome) in flight at once",
    )
    parser.add_argument(
        "--command-seconds",
        type=float,
        default=3.0,
        help="a command runs for uniform(0, this) seconds",
    )
    freeze = "once every node is held, freeze the objects alive out of garbage collection"
    parser.add_argument("--freeze-when-held", action="store_true", help=freeze)
    args = parser.parse_args()
    raise_fd_limit()
    print(json.dumps(asyncio.run(run(args))), flush=True)


if __name__ == "__main__":
    main()
