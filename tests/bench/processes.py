"""The processes the gateway benches start beside the console under test: a Celery worker
and beat sweeping liveness, and ``reconnecting_load``'s simulated fleet."""

import json
import os
import signal
import statistics
import subprocess
import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from nodes import pki
from tests.bench.test_bench_gateway import enroll, serving
from tests.e2e.console import ROOT, console_env
from tuneplane.schedule import seed_schedule

FLEET_STOP_TIMEOUT_SECONDS = 120
# First opens in flight, over all of a fleet's processes (reconnecting_load's default).
RAMP_CONCURRENCY = 20
# Commands a node would have run twice, told in full.
EXAMPLES = 5


def fleet_console(
    node_fleet, nodes: int, console_pki: Path, redis_url: str, directory: Path, settings: dict
) -> tuple[Path, dict]:
    """``nodes`` nodes enrolled in ``node_fleet`` (their credentials' bundle), and the
    environment of the console processes that serve them."""
    credentials = enroll(node_fleet, nodes, directory)
    if not (console_pki / "gateway.pem").exists():  # before replicas race to issue it
        pki.issue_server_certificate(["127.0.0.1", "localhost"])
    env = console_env(
        directory,
        TUNEPLANE_PKI_DIR=str(console_pki),
        TUNEPLANE_DEBUG="0",
        REDIS_URL=redis_url,
        **settings,
    )
    return credentials, env


def gateway_replica(target: str, env: dict, directory: Path, metrics: str | None = None):
    """``manage.py grpcserve`` bound to ``target``, its output in ``gateway-PORT.log``; its
    /metrics on ``metrics`` when given."""
    serve_metrics = ["--metrics-bind", metrics] if metrics else []
    return serving(
        [sys.executable, str(ROOT / "manage.py"), "grpcserve", "--bind", target, *serve_metrics],
        env,
        "gateway serving",
        log=directory / f"gateway-{target.rsplit(':', 1)[1]}.log",
    )


def celery(*args, env: dict, log: Path) -> subprocess.Popen:
    """Output to a file: a worker logging every second's sweep would fill a pipe and stall."""
    with log.open("w") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tuneplane", *args],
            env=env,
            cwd=ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
        )


@contextmanager
def sweepers(env: dict, directory: Path):
    """A Celery worker and beat, sweeping liveness as ``env`` says; yields the worker's log."""
    seed_schedule()
    log = directory / "worker.log"
    worker = celery("worker", "-l", "INFO", "--pool", "solo", env=env, log=log)
    beat = celery(
        "beat",
        "-l",
        "INFO",
        "-s",
        str(directory / "beat-schedule"),
        env=env,
        log=directory / "beat.log",
    )
    try:
        yield log
    finally:
        for process in (beat, worker):
            process.terminate()
        for process in (beat, worker):
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:  # beat once ignored SIGTERM for 30 s; the
                process.kill()  # run's figures are worth more than its stop
                process.wait()


def sweeps_run(log: Path) -> int:
    return sum(
        "nodes.liveness_sweep" in line and "succeeded" in line
        for line in log.read_text().splitlines()
    )


def command_figures(commands: list[dict]) -> dict:
    """What the fleet did with the commands it received (each as ``reconnecting_load``
    reports one)."""
    updates = Counter()
    for command in commands:
        updates.update(command["updates"])
    return {
        "received": {c["command"]: c["received"] for c in commands},
        "received_at": {c["command"]: c["first_received"] for c in commands},
        "states": dict(Counter(c["state"] for c in commands)),
        "redelivered": sum(c["received"] - 1 for c in commands),
        "redelivered_after_forgotten": sum(c["after_forgotten"] for c in commands),
        "updates": dict(updates),
        "updates_repeated": sum(
            count - 1 for c in commands for count in c["updates"].values() if count > 1
        ),
        # What the node went through with the commands it would have run twice.
        "forgotten_then_received": [
            {"node": c["node"], "command": c["command"], "history": c["history"]}
            for c in commands
            if c["after_forgotten"]
        ][:EXAMPLES],
    }


def closed_figures(closed: list[list]) -> dict:
    """By the console's reason: how long the streams it closed were held, the heartbeats
    the node sent on them and the acks it got back (``closed``: [reason, seconds held,
    beats, acks] per stream)."""
    by_reason: dict[str, list[list]] = {}
    for row in closed:
        by_reason.setdefault(row[0], []).append(row)
    return {
        reason: {
            "streams": len(rows),
            "held_seconds_median": round(statistics.median(row[1] for row in rows), 2),
            "beats_median": statistics.median(row[2] for row in rows),
            "acks_max": max(row[3] for row in rows),
        }
        for reason, rows in by_reason.items()
    }


def by_error(shards: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    """The shards' figures of failed opens, by error, each list in order."""
    merged: dict[str, list[float]] = {}
    for shard in shards:
        for error, values in shard.items():
            merged.setdefault(error, []).extend(values)
    return {error: sorted(values) for error, values in merged.items()}


def failed_open_figures(seconds_run: dict[str, list[float]]) -> dict:
    """By error: how many opens ended before their Welcome, and how long they had run
    (p50 and max seconds from the connect)."""
    return {
        error: [len(seconds), round(statistics.median(seconds), 1), seconds[-1]]
        for error, seconds in seconds_run.items()
    }


def merged(shards: list[dict]) -> dict:
    """One fleet's figures from its shards' results."""
    welcomed = [shard["ramp_seconds"] for shard in shards if shard["ramp_seconds"] is not None]
    return {
        "nodes": sum(shard["nodes"] for shard in shards),
        "shards": len(shards),
        "held_at_stop": sum(shard["held_at_stop"] for shard in shards),
        "ramp_seconds": max(welcomed) if welcomed else None,
        "outages": [outage for shard in shards for outage in shard["outages"]],
        "commands": command_figures([c for shard in shards for c in shard["commands"]]),
        "closed_by_console": closed_figures([row for shard in shards for row in shard["closed"]]),
        "errors": dict(sum((Counter(shard["errors"]) for shard in shards), Counter())),
        "failed_opens": failed_open_figures(by_error([shard["failed_opens"] for shard in shards])),
        "failed_open_ends": by_error([shard["failed_open_ends"] for shard in shards]),
        "loop_lag_max_seconds": max(shard["loop_lag_max_seconds"] for shard in shards),
        "held_loop_lag_max_seconds": max(s["held_loop_lag_max_seconds"] for s in shards),
        "held_gc_pause_max_seconds": max(s["held_gc_pause_max_seconds"] for s in shards),
    }


class ReconnectingFleet:
    """The simulated nodes, as ``processes`` subprocesses sharing them, whose progress goes
    to ``fleet.log``."""

    def __init__(
        self,
        targets: list[str],
        credentials: Path,
        directory: Path,
        nodes: int,
        processes: int,
        options: tuple[str, ...] = (),
    ):
        self.log = directory / "fleet.log"
        with self.log.open("w") as stderr:
            self.processes = [
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tests.bench.reconnecting_load",
                        "--credentials",
                        str(credentials),
                        "--nodes",
                        str(nodes),
                        "--shard",
                        str(shard),
                        "--shards",
                        str(processes),
                        "--ramp-concurrency",
                        str(max(1, RAMP_CONCURRENCY // processes)),
                        *[option for target in targets for option in ("--target", target)],
                        *options,
                    ],
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    text=True,
                )
                for shard in range(processes)
            ]

    def running(self) -> bool:
        """For waits: a fleet that died fails them at once, with its last words."""
        assert all(p.poll() is None for p in self.processes), self.log.read_text()[-4000:]
        return True

    def stop(self) -> dict:
        """SIGTERM: the nodes close their streams; their figures, as JSON."""
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
        results = []
        for process in self.processes:
            out = process.communicate(timeout=FLEET_STOP_TIMEOUT_SECONDS)[0]
            assert process.returncode == 0, self.log.read_text()[-4000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
        return merged(results)


@contextmanager
def reconnecting_fleet(
    targets: list[str],
    credentials: Path,
    directory: Path,
    nodes: int,
    options: tuple[str, ...] = (),
):
    """``TUNEPLANE_BENCH_FLEET_PROCESSES`` processes (default 1). At 10,000 nodes after a
    SIGKILL, one process took about 20 s to see every stream end; four saw them at once,
    but their reconnect attempts, four times as many while the replica was down, took
    from this 2-core machine's CPU what the restarted replica needed."""
    processes = int(os.environ.get("TUNEPLANE_BENCH_FLEET_PROCESSES", "1"))
    fleet = ReconnectingFleet(targets, credentials, directory, nodes, processes, options)
    try:
        yield fleet
    finally:
        for process in fleet.processes:
            if process.returncode is None:
                process.kill()
                process.wait()
