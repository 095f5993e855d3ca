"""Simulated nodes that come back, for `make bench`: N NodeControl streams from one process,
each reconnecting as ``tuneplane-node serve`` does when its gateway goes away.

Standalone (grpc.aio, no Django), run as a subprocess so its load is not the caller's::

    python -m tests.bench.reconnecting_load --target 127.0.0.1:8443 --credentials nodes.json

``nodes.json`` is ``gateway_load``'s bundle. Each node, like the real agent
(``nodes/agent/serve.py``):

- opens a stream on a channel of its own to one ``--target`` picked at random
  per connect: Hello carrying the commands it knows (CommandState), then Welcome;
- sends its inventory, then a heartbeat every interval the Welcome gives, each
  followed by CommandUpdates for commands whose state this stream has not told;
- on a command it does not know: records it (in memory, as the agent's state
  dir does), reports ``running`` and, a random while later, ``succeeded``. A
  command it knows is not run again: its state is told again, as the agent does;
- once a Welcome has followed a Hello that told a finished command, forgets it
  from later Hellos (the agent deletes its file): delivered again after that,
  the real agent would run it twice — counted as ``redelivered_after_forgotten``;
- when the stream ends, reconnects after a jittered exponential backoff
  (``--backoff-first`` doubling to ``--backoff-max``, times uniform(0.5, 1)).

Only the first open of each node is paced (``--ramp-concurrency``), to set the
fleet up; reconnects are paced by nothing but their backoff, as real agents'.
Every outage is recorded: when the stream ended, how many connects it took,
when the next Welcome came. Runs until SIGTERM or SIGINT; progress goes to
stderr and the result is one JSON line on stdout.
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
from nodes.agent.serve import inventory_digest, inventory_message
from tests.bench.gateway_load import describe, raise_fd_limit

RUNNING, SUCCEEDED = "running", "succeeded"
PROGRESS_SECONDS = 5
INVENTORY = inventory_message({
    "cards": [{"name": "NVIDIA H100 80GB HBM3", "count": 8}], "driver": "550.54",
    "container_runtime": "docker 28.2.2", "storage_root_visible": True,
    "cpu_budget": 64, "memory_budget_bytes": 512 * 2**30})
INVENTORY_DIGEST = inventory_digest(INVENTORY)


@dataclass
class Outage:
    """From a held stream's end to the next Welcome (None: still out when the fleet stopped)."""

    lost: float  # epoch seconds, so the caller can line them up with its own clock
    connects: int = 0
    welcomed: float | None = None


@dataclass
class KnownCommand:
    """A command as the node's state dir holds it."""

    state: str = RUNNING
    received: int = 1
    in_hello: bool = True  # False once forgotten: the console has reconciled it finished
    redelivered_after_forgotten: int = 0
    updates: Counter = field(default_factory=Counter)  # CommandUpdates sent, by state


class Fleet:
    """What every node shares: the targets, the stop, the counts of how streams ended."""

    def __init__(self, args):
        self.args = args
        self.stopping = asyncio.Event()
        self.errors: Counter = Counter()
        self.closes: Counter = Counter()
        self.running: set[asyncio.Task] = set()  # commands being "run", kept from the collector

    def backoff(self, attempt: int) -> float:
        """The agent's: attempt 0 follows a stream that got a Welcome."""
        base = min(self.args.backoff_max, self.args.backoff_first * 2 ** attempt)
        return base * random.uniform(0.5, 1.0)


class SimulatedNode:
    def __init__(self, fleet: Fleet, ca: bytes, node: dict):
        self.fleet = fleet
        self.node_id = node["node_id"]
        self.credentials = grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=node["key"].encode(),
            certificate_chain=node["cert"].encode())
        self.known: dict[str, KnownCommand] = {}
        self.reported: dict[str, str] = {}  # what the current stream has told, by command
        self.outages: list[Outage] = []
        self.held = False
        self.first_welcome: float | None = None
        self.settled = asyncio.Event()  # the first open got a Welcome, or failed

    async def live(self) -> None:
        attempt, outage = 0, None
        while True:
            if outage is not None:
                outage.connects += 1
            welcomed = await self.stream(random.choice(self.fleet.args.target), outage)
            self.settled.set()
            if welcomed:
                outage = Outage(lost=time.time())
                self.outages.append(outage)
            attempt = 0 if welcomed else attempt + 1
            await asyncio.sleep(self.fleet.backoff(attempt))

    async def stream(self, target: str, outage: Outage | None) -> bool:
        """One stream, until it ends. Returns whether it got as far as a Welcome."""
        outgoing: asyncio.Queue = asyncio.Queue()
        told = {command_id: command.state for command_id, command in self.known.items()
                if command.in_hello}
        self.reported = dict(told)
        outgoing.put_nowait(pb.NodeMessage(hello=pb.Hello(
            node_id=self.node_id, agent_version="bench-reconnecting",
            commands=[pb.CommandState(command_id=command_id, state=state,
                                      exit_code=0) for command_id, state in told.items()])))

        async def requests():
            while (message := await outgoing.get()) is not None:
                yield message

        channel = grpc.aio.secure_channel(target, self.credentials,
                                          options=[("grpc.use_local_subchannel_pool", 1)])
        beating, welcomed = None, False
        try:
            async for message in control_pb2_grpc.NodeControlStub(channel).Connect(requests()):
                kind = message.WhichOneof("body")
                if kind == "welcome":
                    welcomed, self.held = True, True
                    self._welcomed(told, outage)
                    outgoing.put_nowait(pb.NodeMessage(inventory=INVENTORY))
                    beating = asyncio.create_task(self._beat(
                        outgoing, message.welcome.heartbeat_interval_seconds))
                elif kind == "command":
                    self._accept(message.command, outgoing)
                elif kind == "close":
                    self.fleet.closes[message.close.reason] += 1
        except grpc.aio.AioRpcError as error:
            self.fleet.errors[f"{'stream' if welcomed else 'open'}: {describe(error)}"] += 1
        finally:
            self.held = False
            if beating is not None:
                beating.cancel()
            outgoing.put_nowait(None)
            await channel.close()
        return welcomed

    def _welcomed(self, told: dict[str, str], outage: Outage | None) -> None:
        now = time.time()
        if outage is None:
            self.first_welcome = self.first_welcome or now
        else:
            outage.welcomed = now
        # As the agent: finished commands this Hello told the console need not be told again.
        for command_id, state in told.items():
            if state != RUNNING:
                self.known[command_id].in_hello = False

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
        self._tell(message.command_id, outgoing)

    async def _run(self, command: KnownCommand) -> None:
        await asyncio.sleep(random.uniform(0, self.fleet.args.command_seconds))
        command.state = SUCCEEDED

    def _tell(self, command_id: str, outgoing: asyncio.Queue) -> None:
        command = self.known[command_id]
        self.reported[command_id] = command.state
        command.updates[command.state] += 1
        outgoing.put_nowait(pb.NodeMessage(command_update=pb.CommandUpdate(
            state=pb.CommandState(command_id=command_id, state=command.state, exit_code=0))))

    async def _beat(self, outgoing: asyncio.Queue, interval: int) -> None:
        sequence = 0
        while True:
            await asyncio.sleep(interval)
            sequence += 1
            outgoing.put_nowait(pb.NodeMessage(heartbeat=pb.Heartbeat(
                sequence=sequence, storage_root_visible=True,
                inventory_digest=INVENTORY_DIGEST)))
            for command_id, command in self.known.items():
                if self.reported.get(command_id) not in (None, command.state):
                    self._tell(command_id, outgoing)


async def progress(nodes: list[SimulatedNode], started: float) -> None:
    while True:
        await asyncio.sleep(PROGRESS_SECONDS)
        held = sum(node.held for node in nodes)
        print(f"reconnecting fleet: {held} held, {len(nodes) - held} out, "
              f"{time.time() - started:.0f} s", file=sys.stderr, flush=True)


def command_figures(nodes: list[SimulatedNode]) -> dict:
    commands = [command for node in nodes for command in node.known.values()]
    updates = Counter()
    for command in commands:
        updates.update(command.updates)
    return {
        "received": {command_id: command.received for node in nodes
                     for command_id, command in node.known.items()},
        "states": dict(Counter(command.state for command in commands)),
        "redelivered": sum(command.received - 1 for command in commands),
        "redelivered_after_forgotten": sum(c.redelivered_after_forgotten for c in commands),
        "updates": dict(updates),
        "updates_repeated": sum(count - 1 for command in commands
                                for count in command.updates.values() if count > 1)}


async def run(args) -> dict:
    with open(args.credentials) as handle:
        bundle = json.load(handle)
    ca = bundle["ca"].encode()
    fleet = Fleet(args)
    nodes = [SimulatedNode(fleet, ca, node) for node in bundle["nodes"][:args.nodes]]
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, fleet.stopping.set)
    started = time.time()
    opens = asyncio.Semaphore(args.ramp_concurrency)

    async def first_open(node: SimulatedNode) -> asyncio.Task:
        async with opens:
            life = asyncio.create_task(node.live())
            await node.settled.wait()
        return life

    reporting = asyncio.create_task(progress(nodes, started))
    ramp = asyncio.create_task(asyncio.gather(*(first_open(node) for node in nodes)))
    await fleet.stopping.wait()
    held = sum(node.held for node in nodes)
    lives = await ramp if ramp.done() else []
    for task in [reporting, ramp, *lives, *fleet.running]:
        task.cancel()
    await asyncio.gather(reporting, ramp, *lives, return_exceptions=True)
    welcomes = [node.first_welcome for node in nodes if node.first_welcome]
    return {
        "nodes": len(nodes), "targets": args.target, "held_at_stop": held,
        "ramp_seconds": round(max(welcomes) - started, 2) if welcomes else None,
        "outages": [[node.node_id, outage.lost, outage.welcomed, outage.connects]
                    for node in nodes for outage in node.outages],
        "commands": command_figures(nodes),
        "closes": dict(fleet.closes), "errors": dict(fleet.errors)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True, action="append",
                        help="HOST:PORT of a gateway replica; repeat for several")
    parser.add_argument("--credentials", required=True, help="the nodes' JSON bundle")
    parser.add_argument("--nodes", type=int, default=None, help="at most this many nodes")
    parser.add_argument("--ramp-concurrency", type=int, default=20,
                        help="first opens (TLS handshake + Hello/Welcome) in flight at once")
    parser.add_argument("--backoff-first", type=float, default=1.0, help="seconds")
    parser.add_argument("--backoff-max", type=float, default=8.0, help="seconds")
    parser.add_argument("--command-seconds", type=float, default=3.0,
                        help="a command runs for uniform(0, this) seconds")
    args = parser.parse_args()
    raise_fd_limit()
    print(json.dumps(asyncio.run(run(args))), flush=True)


if __name__ == "__main__":
    main()
