"""PostgreSQL restarted under load: web, gateway, worker and beat recover without a restart of
their own, no request fails for longer than the outage, and nothing is half-written.

The whole console (``manage.py runconsole``: what ``make run`` starts) runs on a PostgreSQL
server of this test's own, so that server can be stopped for real — ``pg_ctl stop -m
immediate``, as a crash, with recovery at the next start — without touching the one the rest
of the suite and this test's own connection use. A real agent holds a control stream, and a
client writes and reads through the API all along.
"""

import contextlib
import glob
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from tests.conftest import H100_INVENTORY
from tests.nodes.agent_process import agent, inventory_file, machine

from .agents import serve, wait_until
from .console import Console, console_env, free_port, manage
from .running import SHORT

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

OUTAGE_SECONDS = 6
# After the server is back, a request may still meet a connection that saw it go: the first
# use of each broken connection fails once. Longer than this, and recovery is not by itself.
RECOVERY_SECONDS = 3


class PrivatePostgres:
    """A PostgreSQL server in a directory of its own, run as the postgres user."""

    def __init__(self):
        binaries = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        if not binaries or not shutil.which("runuser"):
            if os.environ.get("CI"):
                pytest.fail("PostgreSQL server binaries are required in CI")
            pytest.skip("no PostgreSQL server binaries to run a private server")
        self.bin = Path(binaries[-1]).parent
        self.home = Path(tempfile.mkdtemp(prefix="tuneplane-pg-"))
        shutil.chown(self.home, "postgres", "postgres")
        self.port = free_port()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/tuneplane"
        self._as_postgres(
            "initdb",
            "-D",
            str(self.home / "data"),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
        )

    def _as_postgres(self, program: str, *args: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", str(self.bin / program), *args],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def start(self) -> None:
        self._as_postgres(
            "pg_ctl",
            "-D",
            str(self.home / "data"),
            "-l",
            str(self.home / "server.log"),
            "-w",
            "-o",
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.home} "
            "-c fsync=off -c max_connections=200",
            "start",
        )

    def crash(self) -> None:
        self._as_postgres("pg_ctl", "-D", str(self.home / "data"), "-m", "immediate", "stop")

    def query(self, sql: str) -> list[tuple]:
        with psycopg.connect(self.url, connect_timeout=5) as connection:
            return connection.execute(sql).fetchall()

    def remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            self._as_postgres("pg_ctl", "-D", str(self.home / "data"), "-m", "immediate", "stop")
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture
def private_postgres():
    server = PrivatePostgres()
    try:
        server.start()
        server._as_postgres(
            "createdb", "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres", "tuneplane"
        )
        yield server
    finally:
        server.remove()


def call(method: str, url: str, token: str, body=None) -> tuple[int, dict]:
    request = urllib.request.Request(
        url,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        raw = error.read()
        try:
            return error.code, json.loads(raw)
        except ValueError:
            return error.code, {"unparsed": raw[:200].decode(errors="replace")}


@dataclass
class Answer:
    started: float
    ended: float
    method: str
    fleet: str
    status: int
    body: dict


class Load:
    """One client, all along: create a Fleet, read the list, again and again."""

    def __init__(self, base: str, token: str):
        self.base, self.token = base, token
        self.answers: list[Answer] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        number = 0
        while not self.stopping.is_set():
            number += 1
            fleet = f"load-{number}"
            for method, path, body in (
                ("POST", "/api/fleets", {"id": fleet, "kind": "node"}),
                ("GET", "/api/fleets?limit=1", None),
            ):
                started = time.monotonic()
                status, answer = call(method, self.base + path, self.token, body)
                self.answers.append(
                    Answer(started, time.monotonic(), method, fleet, status, answer)
                )
            time.sleep(0.05)

    def __enter__(self) -> "Load":
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stopping.set()
        self.thread.join(30)


def test_postgres_crashed_and_restarted_under_load_recovers_and_loses_nothing(
    private_postgres, require_redis, tmp_path
):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = console_env(
        tmp_path / "console", DATABASE_URL=private_postgres.url, REDIS_URL=require_redis, **SHORT
    )
    console = Console(env, port)
    agent_process = None
    try:
        console.wait_for("Tuneplane console is up")
        console.wait_for("gateway serving NodeControl")
        token = manage("create_api_token", "admin", env=env).stdout.strip()
        assert (
            call(
                "POST",
                f"{base}/api/fleets",
                token,
                {"id": "gpu-lab", "kind": "node", "capabilities": ["train", "serve"]},
            )[0]
            == 201
        )
        status, minted = call("POST", f"{base}/api/fleets/gpu-lab/join-tokens", token)
        assert status == 201, minted
        node_env = machine(tmp_path)
        joined = agent(
            "join",
            "--server",
            base,
            "--fleet",
            "gpu-lab",
            "--token",
            minted["token"],
            "--inventory-file",
            inventory_file(tmp_path, H100_INVENTORY),
            env=node_env,
        )
        assert joined.returncode == 0, joined.stdout + joined.stderr
        node = call("GET", f"{base}/api/nodes", token)[1]["results"][0]["id"]
        agent_process = serve(node_env, console.gateway, tmp_path)
        wait_until(
            lambda: call("GET", f"{base}/api/nodes/{node}", token)[1]["scheduling"]["state"]
            == "schedulable",
            timeout=30,
            what="the node serving",
        )

        with Load(base, token) as load:
            time.sleep(3)
            crashed = time.monotonic()
            private_postgres.crash()
            time.sleep(OUTAGE_SECONDS)
            private_postgres.start()
            back = time.monotonic()
            time.sleep(10)
        outage = back - crashed

        # Web: failures only while the server was away, each the API's 503, and none from a
        # request begun once it had been back a moment.
        failed = [a for a in load.answers if a.status >= 500]
        assert failed, "the load never met the outage"
        assert all(
            a.status == 503 and a.body["error"]["code"] == "database_unavailable" for a in failed
        ), failed[:3]
        assert not [a for a in failed if a.started > back + RECOVERY_SECONDS], failed[-3:]
        failing_for = max(a.ended for a in failed) - min(a.started for a in failed)
        assert failing_for <= outage + RECOVERY_SECONDS, (failing_for, outage)
        print(
            f"\npostgres restart: down {outage:.1f} s; {len(load.answers)} requests, "
            f"{len(failed)} answered 503 over {failing_for:.1f} s; last 503 began "
            f"{max(a.started for a in failed) - back:+.1f} s from the server being back"
        )
        after = [a for a in load.answers if a.started > back + RECOVERY_SECONDS]
        assert len(after) > 10 and {a.status for a in after} <= {200, 201}

        # Nothing half-written: a Fleet exists exactly when its creation was audited, once;
        # every 201 is a Fleet that exists.
        created = {a.fleet for a in load.answers if a.method == "POST" and a.status == 201}
        fleets = {
            row[0]
            for row in private_postgres.query("SELECT id FROM fleets_fleet WHERE id LIKE 'load-%'")
        }
        audited = private_postgres.query(
            "SELECT target_id, count(*) FROM audit_auditevent WHERE action = 'fleet.created' "
            "AND target_id LIKE 'load-%' GROUP BY target_id"
        )
        assert created <= fleets
        assert {target for target, _ in audited} == fleets
        assert all(count == 1 for _, count in audited)

        # Gateway: the node is still there, and a command sent now reaches it and is recorded.
        status, sent = call(
            "POST",
            f"{base}/api/nodes/{node}/commands",
            token,
            {"kind": "run", "payload": {"argv": ["true"]}},
        )
        assert status == 201, sent
        wait_until(
            lambda: call("GET", f"{base}/api/nodes/{node}/commands", token)[1]["results"][0][
                "state"
            ]
            == "succeeded",
            timeout=30,
            what="a command through the recovered gateway",
        )
        shown = call("GET", f"{base}/api/nodes/{node}", token)[1]
        assert shown["scheduling"]["state"] == "schedulable"
        assert shown["connection"]["state"] == "connected"
        assert shown["liveness"]["serve"] == "ok", shown["liveness"]

        # Worker and beat: the liveness sweep still runs; the node is judged once it is quiet.
        agent_process.send_signal(9)
        agent_process.wait(10)
        wait_until(
            lambda: call("GET", f"{base}/api/nodes/{node}", token)[1]["liveness"]["serve"]
            == "quiet",
            timeout=30,
            what="the sweep after the restart",
        )
        assert console.process.poll() is None, "a console process gave up"
        assert "restarting in" not in console.output, "a process died (and was restarted)"
    finally:
        if agent_process is not None and agent_process.returncode is None:
            agent_process.send_signal(9)
        code = console.stop()
    assert code == 0, console.output[-3000:]
