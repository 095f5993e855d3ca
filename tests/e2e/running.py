"""A console running for real, as the e2e tests and benchmarks stand it up: Celery workers and
beat sweeping with thresholds in seconds, a gateway, and a node with a live agent where jobs
run (``running_node``) or deployments serve (``serving_node``) — fixtures registered for the
whole suite by tests/conftest.py — with the API calls those tests share."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from nodes.models import ControlSession, Node
from placement.models import Member
from tests.agent_members import SERVER, listener
from tests.conftest import H100_DEVICE_INVENTORY
from tuneplane.schedule import seed_schedule

from .agents import lay_out_a_joined_node, running_gateway, serve, wait_until
from .console import ROOT, console_env

# The lease too: silence counts only once a gateway has listened for one (the grace rule).
SHORT = {
    "TUNEPLANE_SWEEP_INTERVAL": "1",
    "TUNEPLANE_QUIET_SERVE": "2",
    "TUNEPLANE_QUIET_ENV": "2",
    "TUNEPLANE_QUIET_TRAIN": "8",
    "TUNEPLANE_HEARTBEAT_INTERVAL": "1",
    "TUNEPLANE_LEASE_TTL": "3",
}
# Where a test watches one threshold pass before the next, room between them: on a loaded
# machine (tests in parallel on two cores) a few sweeps may come late.
ROOMY = {**SHORT, "TUNEPLANE_QUIET_TRAIN": "20"}


def celery(*args, env):
    """A Celery process whose output goes to a file in its var dir: a pipe nobody reads fills
    up within a minute of INFO lines, and the process then blocks on its next log line."""
    log = Path(env["TUNEPLANE_VAR_DIR"]) / f"celery-{args[0]}-{time.monotonic_ns()}.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tuneplane", *args],
            env=env,
            cwd=ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    process.log = log
    return process


def stopped(*processes, timeout: float = 30) -> None:
    """SIGTERM to each, then each waited for; one still running after ``timeout`` is killed
    and named. Never left behind: a worker that outlived its test took the next tests'
    allocations from their Redis database, on the same pytest-xdist worker, for the rest of
    the run and the runs after it."""
    for process in processes:
        process.terminate()
    lingering, said = [], []
    for process in processes:
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            # Where it was stuck first: beat dumps its threads' stacks on SIGUSR1
            # (tuneplane/celery.py), the worker its own (Celery's), into its log.
            process.send_signal(signal.SIGUSR1)
            time.sleep(1)
            process.kill()
            process.wait(10)
            lingering.append(" ".join(process.args[3:6]))
            log = getattr(process, "log", None)
            if log is not None and log.exists():
                said.append(f"--- {log.name}:\n" + log.read_text(errors="replace")[-6000:])
    if lingering:
        raise AssertionError(
            f"killed after {timeout:.0f} s without stopping: {lingering}\n" + "\n".join(said)
        )


@contextmanager
def sweepers(tmp_path, redis_url, thresholds=SHORT):
    """A Celery worker and beat sweeping every second, thresholds in seconds."""
    seed_schedule()
    console = console_env(tmp_path, REDIS_URL=redis_url, **thresholds)
    worker = celery("worker", "-l", "INFO", "--pool", "solo", env=console)
    beat = celery("beat", "-l", "INFO", "-s", str(tmp_path / "beat-schedule"), env=console)
    try:
        yield
    finally:
        stopped(beat, worker)


@contextmanager
def sweeping_console(tmp_path, console_pki, redis_url, thresholds=ROOMY):
    """The sweepers and a gateway."""
    with (
        sweepers(tmp_path, redis_url, thresholds),
        running_gateway(tmp_path, console_pki, REDIS_URL=redis_url, **thresholds) as target,
    ):
        yield target


FAST = {"TUNEPLANE_HEARTBEAT_INTERVAL": "1", "TUNEPLANE_LEASE_TTL": "3"}


@contextmanager
def worker(tmp_path, redis_url, **settings):
    """A real Celery worker: what admission's allocation task runs in."""
    process = celery(
        "worker",
        "-l",
        "INFO",
        "--pool",
        "solo",
        env=console_env(tmp_path, REDIS_URL=redis_url, **settings),
    )
    try:
        yield process
    finally:
        stopped(process)


@pytest.fixture
def running_node(request, require_redis, tmp_path, console_pki, node_fleet, mint):
    """A node Fleet's node with a live agent, a gateway and a worker: where jobs run. The
    worker's settings may be added to by an indirect parameter (a dict)."""
    node, env, directory = lay_out_a_joined_node(node_fleet, mint, tmp_path)
    settings = {"TUNEPLANE_STOP_GRACE": "3", **getattr(request, "param", {})}
    with (
        worker(tmp_path, require_redis, **settings),
        running_gateway(tmp_path, console_pki, REDIS_URL=require_redis, **FAST) as target,
    ):
        agent = serve(env, target, tmp_path, inventory=H100_DEVICE_INVENTORY)
        try:
            wait_until(
                lambda: ControlSession.objects.filter(node=node, closed_at__isnull=True).exists()
                and node.__class__.objects.get(pk=node.pk).inventory.get("devices"),
                what="the node connected with its devices",
            )
            yield node, env, directory, target, agent
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(20)


def submit(api, **body):
    response = api.post("/api/training-jobs", {"project": "ml", "name": "job", "cards": 2, **body})
    assert response.status_code == 201, response.content
    return response.json()


def job_shown(api, job_id):
    return next(
        job for job in api.get("/api/training-jobs").json()["results"] if job["id"] == job_id
    )


def state_is(api, job_id, *states):
    job = job_shown(api, job_id)
    return job if job["state"] in states else None


ROLLOUT = {**ROOMY, "TUNEPLANE_ROLLOUT_DEADLINE": "12", "TUNEPLANE_STOP_GRACE": "3"}


@pytest.fixture
def serving_node(require_redis, tmp_path, console_pki, make_fleet, mint, settings):
    """A node Fleet's node with a live agent, a gateway, a worker and beat sweeping."""
    settings.TUNEPLANE_SWEEP_INTERVAL = 1
    fleet = make_fleet("serve-lab", kind="node", capabilities=["train", "serve", "env"])
    node, env, _ = lay_out_a_joined_node(fleet, mint, tmp_path)
    Node.objects.filter(pk=node.pk).update(address="127.0.0.1:9")
    agents = []
    with sweeping_console(tmp_path, console_pki, require_redis, ROLLOUT) as target:

        def start_agent():
            agents.append(serve(env, target, tmp_path, inventory=H100_DEVICE_INVENTORY))
            wait_until(
                lambda: ControlSession.objects.filter(node=node, closed_at__isnull=True).exists()
                and Node.objects.get(pk=node.pk).inventory.get("devices"),
                what="the node connected with its devices",
            )
            return agents[-1]

        start_agent()
        try:
            yield node, start_agent, agents
        finally:
            for agent in agents:
                if agent.returncode is None:
                    agent.send_signal(signal.SIGTERM)
                    agent.wait(20)
            for member in Member.objects.filter(node=node, port__isnull=False):  # none listening
                pid = listener(member.port)
                if pid:
                    os.kill(pid, signal.SIGKILL)


def answers(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=3) as response:
            return json.loads(response.read())
    except OSError:
        return None


def deployment_shown(api, deployment_id):
    return api.get(f"/api/deployments/{deployment_id}").json()


def deploy(api, port, **body):
    response = api.post(
        "/api/deployments",
        {
            "project": "ml",
            "name": "chat",
            "cards": 1,
            "command": ["python3", "-c", SERVER],
            "port": port,
            "readiness_path": "/health",
            **body,
        },
    )
    assert response.status_code == 201, response.content
    return response.json()


def status_is(api, deployment_id, status):
    body = deployment_shown(api, deployment_id)
    return body if body["status"] == status else None


def release(directory: Path, timeout: float = 20) -> None:
    """Touch ``release`` in the scratch dir of the one member an agent (its state dir) runs:
    the node's own path to what the member sees as $TUNEPLANE_SCRATCH_DIR. A confined member
    sees nothing else of the node (R18), so a test hands it something there."""
    members = Path(directory) / "members"
    deadline = time.monotonic() + timeout
    while not (found := [path for path in members.glob("*") if path.is_dir()]):
        assert time.monotonic() < deadline, f"no member's scratch dir under {members}"
        time.sleep(0.1)
    (found,) = found
    (found / "release").touch()
    os.chown(found / "release", found.stat().st_uid, found.stat().st_gid)


def output_of(api, job_id: int, rank: int = 0) -> str:
    return api.get(f"/api/training-jobs/{job_id}/logs?rank={rank}").json()["output"]
