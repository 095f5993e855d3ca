"""`make bench`: a command for one node among N connected, from the API call to the node.

N simulated nodes (``tests/bench/reconnecting_load.py``: one mTLS stream per node, the
agent's protocol) on two gateway replicas, each node on one picked at random; Redis between
them and the API, a Celery worker and beat sweeping liveness, production's heartbeat and
lease. Once every node holds a session and has beaten twice, ``COMMANDS`` commands are
created through the REST API (``POST /api/nodes/{id}/commands`` with a bearer token), one
every ``1 / RATE`` seconds, each for a node drawn at random: the replica that holds its
stream learns of it from Redis. Printed, per command: from the start of the API call to
the node's receipt (p50 / p99 / max), split where the event is seen on Redis (by a
subscriber of the bench's own: the API's transaction and publish before it, the replica and
the node after it), the API call's own time, and, once every node is held, how late the
fleet's loop ran and its longest garbage collection (a fleet behind on reading would be
counted against the console: it freezes its streams' objects out of its collector then).

N is ``TUNEPLANE_BENCH_FANOUT_NODES`` (default 1000; issue 20's figure is at 10000), the
commands ``TUNEPLANE_BENCH_FANOUT_COMMANDS`` (default 200). Not a timed test: it asserts
only that each command reached its node once and finished.
"""

import os
import random
import statistics
import threading
import time
from contextlib import ExitStack, contextmanager

import pytest
import redis

from nodes import bus
from nodes.choices import CommandState
from nodes.models import ControlSession, Node, NodeCommand
from tests.bench.processes import fleet_console, gateway_replica, reconnecting_fleet, sweepers
from tests.conftest import Api
from tests.e2e.agents import wait_until
from tests.e2e.console import free_port

pytestmark = [pytest.mark.bench, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

NODES = int(os.environ.get("TUNEPLANE_BENCH_FANOUT_NODES", "1000"))
COMMANDS = int(os.environ.get("TUNEPLANE_BENCH_FANOUT_COMMANDS", "200"))
RATE = 10  # commands a second
REPLICAS = 2
SETTINGS = {"TUNEPLANE_HEARTBEAT_INTERVAL": "10", "TUNEPLANE_LEASE_TTL": "30"}
RAMP_TIMEOUT_SECONDS = 600
DONE_TIMEOUT_SECONDS = 120


def spread(values: list[float]) -> str:
    """p50 / p99 / max, in milliseconds."""
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * len(ordered)) - 1)]
    return " / ".join(f"{1000 * v:.0f}" for v in (statistics.median(ordered), p99, ordered[-1]))


@contextmanager
def events_seen(redis_url: str):
    """When each node's commands event is seen on Redis, by node id (epoch seconds)."""
    seen: dict[str, float] = {}
    client = redis.Redis.from_url(redis_url)
    pubsub = client.pubsub()
    pubsub.subscribe(bus.CHANNEL)
    pubsub.get_message(timeout=5)  # the subscription's confirmation
    stop = threading.Event()

    def listen():
        while not stop.is_set():
            message = pubsub.get_message(timeout=0.5)
            if message and message["type"] == "message":
                event = bus.parse(message["data"])
                if event and event["type"] == bus.COMMANDS:
                    seen.setdefault(event["node"], time.time())

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()
        pubsub.close()
        client.close()


def test_bench_command_fanout_through_redis_to_the_replica_holding_the_stream(
    require_redis, node_fleet, admin_user, console_pki, tmp_path, capsys
):
    credentials, env = fleet_console(
        node_fleet, NODES, console_pki, require_redis, tmp_path, SETTINGS
    )
    targets = [f"127.0.0.1:{free_port()}" for _ in range(REPLICAS)]
    api = Api(admin_user)
    node_ids = list(Node.objects.values_list("id", flat=True))
    called: dict[str, tuple[float, float]] = {}  # command id: the API call's start and end
    node_of: dict[str, str] = {}  # command id: its node
    with ExitStack() as stack:
        stack.enter_context(sweepers(env, tmp_path))
        for target in targets:
            stack.enter_context(gateway_replica(target, env, tmp_path))
        started = time.monotonic()
        fleet = stack.enter_context(
            reconnecting_fleet(
                targets, credentials, tmp_path, NODES, options=("--freeze-when-held",)
            )
        )
        wait_until(
            lambda: fleet.running()
            and ControlSession.objects.filter(closed_at__isnull=True).count() == NODES,
            RAMP_TIMEOUT_SECONDS,
            what="every node holding a session",
        )
        ramp_seconds = time.monotonic() - started
        time.sleep(2 * int(SETTINGS["TUNEPLANE_HEARTBEAT_INTERVAL"]))  # every stream beat

        seen = stack.enter_context(events_seen(require_redis))
        next_call = time.monotonic()
        for node_id in random.sample(node_ids, min(COMMANDS, NODES)):
            time.sleep(max(0.0, next_call - time.monotonic()))
            next_call += 1 / RATE
            start = time.time()
            response = api.post(
                f"/api/nodes/{node_id}/commands", {"kind": "run", "payload": {"argv": ["true"]}}
            )
            assert response.status_code == 201, response.content
            called[response.json()["id"]] = (start, time.time())
            node_of[response.json()["id"]] = str(node_id)
        wait_until(
            lambda: NodeCommand.objects.filter(state=CommandState.SUCCEEDED).count() == len(called),
            DONE_TIMEOUT_SECONDS,
            what="every command finished",
        )
        closed_while_measured = ControlSession.objects.filter(closed_at__isnull=False).count()
        result = fleet.stop()

    commands = result["commands"]
    delivered = [commands["received_at"][i] - start for i, (start, _) in called.items()]
    api_seconds = [end - start for start, end in called.values()]
    # An event the bench's subscriber missed is left out of the split, and counted.
    on_redis = {i: seen[node_of[i]] for i in called if node_of[i] in seen}
    to_redis = [on_redis[i] - start for i, (start, _) in called.items() if i in on_redis]
    from_redis = [commands["received_at"][i] - on_redis[i] for i in on_redis]
    with capsys.disabled():
        print(
            f"\nbench command fan-out: {NODES:,} nodes on {REPLICAS} replicas (ramp "
            f"{ramp_seconds:.0f} s), {len(called)} commands through the API at {RATE}/s, each "
            f"for a random node\n"
            f"  API call to the node's receipt, p50 / p99 / max: {spread(delivered)} ms\n"
            f"    to the event seen on Redis: {spread(to_redis)} ms; from it to the node: "
            f"{spread(from_redis)} ms ({len(called) - len(on_redis)} events not seen)\n"
            f"  the API call itself: {spread(api_seconds)} ms\n"
            f"  fleet, once every node was held: loop late by "
            f"{result['held_loop_lag_max_seconds']:.2f} s at most, its longest garbage "
            f"collection {result['held_gc_pause_max_seconds']:.2f} s; streams "
            f"the console closed {result['closed_by_console'] or 0}; sessions closed "
            f"{closed_while_measured}; errors {result['errors'] or 0}"
        )

    assert set(called) <= set(commands["received_at"]), "commands that never reached a node"
    assert all(commands["received"][i] == 1 for i in called), "a command delivered twice"
