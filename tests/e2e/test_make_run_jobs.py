"""README's story of a job, against `make run` on its embedded defaults (no Redis: the
filesystem broker and the gateways' polling), with the real agent joined and serving on
the same machine: submit, watch it run, read its logs, cancel (DESIGN §7)."""

import json
import subprocess
import time
import urllib.request
from contextlib import contextmanager

from tests.conftest import H100_DEVICE_INVENTORY
from tests.nodes.agent_process import agent, inventory_file, machine

from .agents import serve
from .console import ROOT, Console, console_env, free_port, manage
from .test_make_run import PRODUCT_PAGE_BODY, call


def wait_for(check, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@contextmanager
def make_run_with_an_agent(tmp_path, database, capabilities=("train", "serve")):
    """`make run` on its embedded defaults, a project, and a real agent joined to its node
    Fleet and serving; yields the console's base URL and an administrator's token."""
    env = console_env(tmp_path, DATABASE_URL=database)
    env.pop("REDIS_URL", None)  # the embedded default
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    console = Console(env, port)
    agent_process = None
    try:
        console.wait_for("Tuneplane console is up")
        made = subprocess.run(
            ["make", "--no-print-directory", "-s", "token", "USER=admin"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        token = made.stdout.strip()
        fleet = {**PRODUCT_PAGE_BODY, "capabilities": list(capabilities)}
        assert call("POST", f"{base}/api/fleets", token, fleet)[0] == 201
        # A project, as an administrator makes one in the admin.
        shell = manage(
            "shell",
            "-c",
            "from audit.services import Actor; from tuneplane.services import project_create; "
            "project_create(actor=Actor.system('readme'), slug='ml', name='ML')",
            env=env,
        )
        assert shell.returncode == 0, shell.stderr
        status, body = call("POST", f"{base}/api/fleets/gpu-lab/join-tokens", token, {})
        assert status == 201, body
        secret = json.loads(body)["token"]

        node_env = machine(tmp_path)
        inventory = inventory_file(tmp_path, H100_DEVICE_INVENTORY)
        joined = agent(
            "join", "--server", base, "--fleet", "gpu-lab", "--token", secret,
            "--inventory-file", inventory, env=node_env,
        )  # fmt: skip
        assert joined.returncode == 0, joined.stderr
        console.wait_for("gateway serving NodeControl")
        agent_process = serve(node_env, console.gateway, tmp_path, inventory=H100_DEVICE_INVENTORY)

        def schedulable():
            status, body = call("GET", f"{base}/api/nodes", token)
            nodes = json.loads(body)["results"] if status == 200 else []
            return nodes and nodes[0]["scheduling"]["state"] == "schedulable"

        wait_for(schedulable, what="the node schedulable")
        yield base, token
        with urllib.request.urlopen(f"{base}/healthz", timeout=10) as health:
            assert health.status == 200
    finally:
        if agent_process is not None:
            agent_process.send_signal(15)
            agent_process.wait(20)
        assert console.stop() == 0, console.output[-3000:]


def test_a_job_runs_logs_and_cancels_against_make_run_with_a_real_agent(tmp_path, empty_database):
    with make_run_with_an_agent(tmp_path, empty_database) as (base, token):

        def job(job_id):
            status, body = call("GET", f"{base}/api/training-jobs", token)
            assert status == 200, body
            return next(j for j in json.loads(body)["results"] if j["id"] == job_id)

        status, body = call(
            "POST",
            f"{base}/api/training-jobs",
            token,
            {
                "project": "ml",
                "name": "hello",
                "cards": 1,
                "script": "echo hello from $TUNEPLANE_JOB",
            },
        )
        assert status == 201, body
        hello = json.loads(body)["id"]
        done = wait_for(lambda: job(hello)["state"] == "succeeded" and job(hello), what="success")
        assert done["attempts"][0]["members"][0]["exit_code"] == 0
        status, body = call("GET", f"{base}/api/training-jobs/{hello}/logs", token)
        assert status == 200, body
        assert json.loads(body)["output"] == f"hello from trainingjob-{hello}\n"

        status, body = call(
            "POST",
            f"{base}/api/training-jobs",
            token,
            {"project": "ml", "name": "long", "cards": 1, "command": ["sleep", "600"]},
        )
        long_job = json.loads(body)["id"]
        wait_for(lambda: job(long_job)["state"] == "running", what="the long job running")
        assert call("POST", f"{base}/api/training-jobs/{long_job}/cancel", token)[0] == 200
        wait_for(lambda: job(long_job)["state"] == "cancelled", what="cancelled")
        wait_for(
            lambda: job(long_job)["attempts"][0]["members"][0]["cleanup"] == "cleaned",
            what="cleaned up",
        )
