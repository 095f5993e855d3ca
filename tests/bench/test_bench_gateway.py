"""`make bench`: the control gateway under N simulated nodes, beside a bare grpc.aio echo server.

One ``grpcserve`` on PostgreSQL, then ``tests/bench/echo_server.py`` (same
grpc.aio, same mutual TLS, no work), each loaded by one
``tests/bench/gateway_load.py`` process opening N streams with N client
certificates. Printed: streams held, ramp time, heartbeats/s and ack latency at
the 10 s interval, database commits/s during the steady window, the closed-loop
maximum heartbeats/s of each server (raw, and per second of server CPU, since
the generator shares the machine) with their ratios, the server's CPU and peak
RSS. The gateway gets the environment's settings (``TUNEPLANE_DB_CONN_MAX_AGE``,
say) with the heartbeat interval and lease TTL of production.

N is ``TUNEPLANE_BENCH_STREAMS`` (default 10000; a comma-separated list runs
each, e.g. ``1000,10000`` to see whether database load depends on N). The
steady window is ``TUNEPLANE_BENCH_WINDOW`` seconds (default 60; the echo server's
``TUNEPLANE_BENCH_ECHO_WINDOW``, by default the same). The gateway's RSS is sampled every
second: its growth over the window (least squares) is reported.

Not a timed test: it asserts only that every stream was held, none failed and
every lease reached the database.
"""

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from django.db.models import F

from nodes import pki
from nodes.agent import wire
from nodes.choices import SchedulingState
from nodes.inventory import normalize_inventory
from nodes.models import ControlSession, Node, NodeCredential, new_node_id
from tests.conftest import make_csr
from tests.e2e.console import ROOT, console_env, database_url, free_port

from . import gateway_report
from .machine import MachineCpu
from .resident import resident_of

pytestmark = [pytest.mark.bench, pytest.mark.django_db(transaction=True)]

INTERVAL_SECONDS = 10
# Stream opens in flight. The gateway opens streams one database call at a time (about
# 10-40 a second here); more in flight only lengthens its queue of database calls, and a
# stream's reader waiting in it past the 30 s lease is closed as silent (seen at 100).
RAMP_CONCURRENCY = 20
# A cold start (issue 20): every node opens at a random moment of the first this many seconds,
# with no bound on opens in flight; 0 opens RAMP_CONCURRENCY at a time instead.
ARRIVE_WITHIN_SECONDS = float(os.environ.get("TUNEPLANE_BENCH_ARRIVE_WITHIN", "10"))
LEASE_TTL_SECONDS = 30
SATURATE_SECONDS = 10
SAMPLE_SECONDS = 1.0
# The server's resident memory by kind (tests/bench/resident.py) is read less often: a
# reading walks every mapping.
KINDS_EVERY_SAMPLES = 30
READY_TIMEOUT_SECONDS = 60
# Past this the server is killed: at N=10,000 the gateway can spend minutes closing sessions.
STOP_TIMEOUT_SECONDS = 60
LOAD_TIMEOUT_SECONDS = 3600


def stream_counts() -> list[int]:
    return [int(n) for n in os.environ.get("TUNEPLANE_BENCH_STREAMS", "10000").split(",")]


WINDOW_SECONDS = int(os.environ.get("TUNEPLANE_BENCH_WINDOW", "60"))
# The echo server's, when a long window is for the gateway's memory alone (e.g. 1800 and 60).
ECHO_WINDOW_SECONDS = int(os.environ.get("TUNEPLANE_BENCH_ECHO_WINDOW", str(WINDOW_SECONDS)))


def enroll(fleet, count: int, directory: Path) -> Path:
    """``count`` nodes, credentials issued as a join issues them; the bundle the generator reads.

    The agent's own key-and-CSR code and the console's ``sign_node_csr``: the
    certificates are what joined nodes present. Only the per-join transaction is
    skipped, for bulk inserts (joins have their own bench). The nodes are a fleet that
    has run before: schedulable, with the simulated nodes' inventory on record.
    """
    from tests.bench.reconnecting_load import INVENTORY

    lifetime = timedelta(seconds=settings.TUNEPLANE_NODE_CREDENTIAL_TTL)
    inventory = normalize_inventory(wire.inventory_report(INVENTORY))
    nodes, credentials, bundle = [], [], []
    for index in range(count):
        node = Node(
            id=new_node_id(),
            fleet=fleet,
            hostname=f"bench-{index:05d}",
            scheduling_state=SchedulingState.SCHEDULABLE,
            inventory=inventory,
            inventory_digest=wire.inventory_digest(INVENTORY),
        )
        key_pem, csr = make_csr(node.hostname)
        issued = pki.sign_node_csr(pki.parse_csr(csr), node.id, lifetime)
        nodes.append(node)
        credentials.append(
            NodeCredential(
                node=node,
                serial=issued.serial,
                fingerprint_sha256=issued.fingerprint_sha256,
                not_before=issued.not_before,
                not_after=issued.not_after,
            )
        )
        bundle.append({"node_id": node.id, "key": key_pem.decode(), "cert": issued.pem})
    Node.objects.bulk_create(nodes, batch_size=1000)
    NodeCredential.objects.bulk_create(credentials, batch_size=1000)
    path = directory / "nodes.json"
    path.write_text(json.dumps({"ca": pki.load_ca().pem, "nodes": bundle}))
    return path


def proc_status(pid: int, field: str) -> int:
    """A ``kB`` line of /proc/PID/status (VmRSS, VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of every thread of the process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Sample:
    at: float
    commits: int
    connections: int
    rows_written: int
    cpu: float
    rss: int  # bytes
    kinds: dict | None = None  # MiB by kind, every KINDS_EVERY_SAMPLES samples


class Sampler(threading.Thread):
    """Once a second: the test database's counters and the server's CPU.

    Statements are not counted: that needs pg_stat_statements preloaded, a server
    setting. ``pg_stat_database`` gives committed transactions instead — each
    atomic block and each statement run outside one counts once (a lease flush
    is one, of two UPDATEs) — and backends started and rows written. It is read
    from the ``postgres`` database so the sampling is not in the figures.
    """

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.database = pid, connection.settings_dict["NAME"]
        self.samples: list[Sample] = []
        self.done = threading.Event()

    def run(self) -> None:
        with psycopg.connect(database_url("postgres"), autocommit=True) as admin:
            while True:
                stopping = self.done.is_set()  # one more sample after, to close the last window
                commits, connections, rows = admin.execute(
                    "SELECT xact_commit, sessions, tup_inserted + tup_updated + tup_deleted "
                    "FROM pg_stat_database WHERE datname = %s",
                    [self.database],
                ).fetchone()
                self.samples.append(
                    Sample(
                        time.time(),
                        commits,
                        connections,
                        rows,
                        cpu_seconds(self.pid),
                        proc_status(self.pid, "VmRSS"),
                        resident_of(self.pid)
                        if stopping or len(self.samples) % KINDS_EVERY_SAMPLES == 0
                        else None,
                    )
                )
                if stopping:
                    return
                self.done.wait(SAMPLE_SECONDS)

    def rate(self, field: str, window: list[float]) -> float:
        """Per second over the samples that enclose ``window`` (epoch seconds)."""
        start, end = window
        before = [s for s in self.samples if s.at <= start][-1]
        after = next(s for s in self.samples if s.at >= end)
        return (getattr(after, field) - getattr(before, field)) / (after.at - before.at)

    def rss_slope(self, window: list[float]) -> float:
        """Least-squares growth of the server's RSS over ``window``, in MiB an hour."""
        points = [(s.at, s.rss / 2**20) for s in self.samples if window[0] <= s.at <= window[1]]
        mean_t = sum(t for t, _ in points) / len(points)
        mean_m = sum(m for _, m in points) / len(points)
        spread = sum((t - mean_t) ** 2 for t, _ in points)
        return 3600 * sum((t - mean_t) * (m - mean_m) for t, m in points) / spread

    def rss_at(self, at: float) -> float:
        """The server's RSS in MiB at the sample nearest ``at`` (epoch seconds)."""
        return min(self.samples, key=lambda s: abs(s.at - at)).rss / 2**20

    def kinds_at(self, at: float) -> dict:
        """The server's resident MiB by kind at the reading nearest ``at``."""
        read = [s for s in self.samples if s.kinds is not None]
        return min(read, key=lambda s: abs(s.at - at)).kinds


class ServerOutput(threading.Thread):
    """A server's output, drained (the gateway logs every session: a full pipe would stall it)."""

    def __init__(self, process: subprocess.Popen, ready: str, log: Path | None = None):
        super().__init__(daemon=True)
        self.process, self.ready, self.log = process, ready, log
        self.tail: deque[str] = deque(maxlen=40)
        self.ready_seen = threading.Event()

    def run(self) -> None:
        with self.log.open("a") if self.log else open("/dev/null", "w") as kept:
            for line in self.process.stdout:
                self.tail.append(line)
                kept.write(line)
                if self.ready in line:
                    self.ready_seen.set()

    @property
    def text(self) -> str:
        return "".join(self.tail)


@contextmanager
def serving(argv: list[str], env: dict, ready: str, log: Path | None = None):
    """A server subprocess, from its ready line until it has stopped; its output kept in
    ``log`` when given.

    Yields the process and a dict that, once the block is left, tells how the
    server stopped.
    """
    process = subprocess.Popen(
        argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    # A stream is a socket: a low soft limit would cap the server, not the code under test.
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.prlimit(process.pid, resource.RLIMIT_NOFILE, (hard, hard))
    output = ServerOutput(process, ready, log)
    output.start()
    stopped = {}
    try:
        assert output.ready_seen.wait(READY_TIMEOUT_SECONDS), output.text
        yield process, stopped
    finally:
        stopping = time.monotonic()
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        output.join(5)
        stopped.update(
            stop_seconds=round(time.monotonic() - stopping, 1), returncode=process.returncode
        )


def load(
    target: str, credentials: Path, streams: int, window: int, metrics: str | None = None
) -> dict:
    """Run the generator against ``target``; its JSON result."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.bench.gateway_load",
            "--target",
            target,
            "--credentials",
            str(credentials),
            "--streams",
            str(streams),
            "--interval",
            str(INTERVAL_SECONDS),
            "--window",
            str(window),
            "--saturate",
            str(SATURATE_SECONDS),
            "--ramp-concurrency",
            str(RAMP_CONCURRENCY),
            "--arrive-within",
            str(ARRIVE_WITHIN_SECONDS),
            *(("--metrics", metrics) if metrics else ()),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        timeout=LOAD_TIMEOUT_SECONDS + window,  # the ramp and saturation, then the window
    )
    assert done.returncode == 0, "the load generator failed: see its captured stderr"
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(
    argv: list[str],
    env: dict,
    ready: str,
    target: str,
    credentials: Path,
    streams: int,
    window: int,
    metrics: str | None = None,
) -> dict:
    """The generator's figures for one server, with the server's own beside them."""
    with serving(argv, env, ready) as (process, stopped):
        idle_rss = proc_status(process.pid, "VmRSS")
        sampler = Sampler(process.pid)
        sampler.start()
        try:
            figures = load(target, credentials, streams, window, metrics)
        finally:
            sampler.done.set()
            sampler.join()
        if metrics:
            figures.update(gateway_report.gc_pauses(metrics))
            figures["opens_refused"] = gateway_report.opens_refused(metrics)
        peak_rss = proc_status(process.pid, "VmHWM")
    steady, saturated = figures["window"], figures["saturation_window"]
    return {
        **figures,
        **stopped,
        "db_commits_per_second": sampler.rate("commits", steady),
        "db_connections_per_second": sampler.rate("connections", steady),
        "db_rows_written_per_second": sampler.rate("rows_written", steady),
        "server_cpu_percent": 100 * sampler.rate("cpu", steady),
        "saturation_server_cpu_percent": 100 * sampler.rate("cpu", saturated),
        "server_peak_rss_mb": peak_rss / 2**20,
        "server_rss_slope_mb_per_hour": sampler.rss_slope(steady),
        # The window's second half: growth that has stopped is warm-up, not a leak.
        "server_rss_slope_late_mb_per_hour": sampler.rss_slope([sum(steady) / 2, steady[1]]),
        "server_rss_window_mb": [sampler.rss_at(steady[0]), sampler.rss_at(steady[1])],
        "server_resident_window": [sampler.kinds_at(steady[0]), sampler.kinds_at(steady[1])],
        "server_rss_per_stream_kb": (peak_rss - idle_rss) / 1024 / streams,
    }


@pytest.mark.parametrize("streams", stream_counts())
def test_bench_gateway_streams_beside_a_bare_echo_server(
    streams, node_fleet, console_pki, tmp_path, capsys
):
    credentials = enroll(node_fleet, streams, tmp_path)
    if not (console_pki / "gateway.pem").exists():  # the echo server uses the gateway's
        pki.issue_server_certificate(["127.0.0.1", "localhost"])

    machine = MachineCpu()
    machine.start()
    target = f"127.0.0.1:{free_port()}"
    env = console_env(
        tmp_path,
        TUNEPLANE_PKI_DIR=str(console_pki),
        TUNEPLANE_DEBUG="0",
        TUNEPLANE_HEARTBEAT_INTERVAL=str(INTERVAL_SECONDS),
        TUNEPLANE_LEASE_TTL=str(LEASE_TTL_SECONDS),
    )
    metrics = f"127.0.0.1:{free_port()}"
    gateway = measure(
        [*(sys.executable, str(ROOT / "manage.py"), "grpcserve"), "--bind", target]
        + ["--metrics-bind", metrics],
        env,
        "gateway serving",
        target,
        credentials,
        streams,
        WINDOW_SECONDS,
        metrics,
    )
    gateway["sessions_closed"] = ControlSession.objects.filter(closed_at__isnull=False).count()

    echo_target = f"127.0.0.1:{free_port()}"
    echo = measure(
        [
            sys.executable,
            "-m",
            "tests.bench.echo_server",
            "--bind",
            echo_target,
            "--pki-dir",
            str(console_pki),
        ],
        env,
        "echo serving",
        echo_target,
        credentials,
        streams,
        ECHO_WINDOW_SECONDS,
    )
    with capsys.disabled():
        print(
            gateway_report.report(gateway, echo, INTERVAL_SECONDS, SATURATE_SECONDS, WINDOW_SECONDS)
        )
        print(machine.stop())

    for name, figures in (("gateway", gateway), ("echo server", echo)):
        assert figures["streams_held"] == figures["streams_open_at_end"] == streams, (
            f"the {name} lost streams: {figures['error_kinds']}"
        )
        assert figures["errors"] == 0, f"the {name}: {figures['error_kinds']}"
    assert ControlSession.objects.count() == streams
    assert ControlSession.objects.filter(last_heartbeat_at__gt=F("opened_at")).count() == streams
