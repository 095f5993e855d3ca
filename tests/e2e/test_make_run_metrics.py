"""A Prometheus scrape of `make run` shows the fleet (issue 19): the web's /metrics adds up
the web, the Celery worker and beat (one PROMETHEUS_MULTIPROC_DIR), the gateway serves its
own; names, types and labels as README says, values moving when a join is refused, an
admission is refused, a node connects, and a fake XID takes a card out of placement and
puts it back. A real agent, on the embedded defaults."""

import json
import subprocess
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import H100_DEVICE_INVENTORY, H100_DEVICES
from tests.nodes.agent_process import agent, inventory_file, machine

from .agents import serve
from .console import ROOT, Console, console_env, free_port, manage
from .test_make_run import PRODUCT_PAGE_BODY, call
from .test_make_run_jobs import wait_for
from .test_telemetry import labelled, write


def scrape(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    figures = {}
    for family in text_string_to_metric_families(text):
        figures[("type", family.name)] = family.type
        for sample in family.samples:
            figures[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return figures


def test_a_scrape_of_make_run_shows_the_fleet(tmp_path, empty_database):
    gateway_metrics = f"127.0.0.1:{free_port()}"
    env = console_env(
        tmp_path,
        DATABASE_URL=empty_database,
        TUNEPLANE_GATEWAY_METRICS_BIND=gateway_metrics,
        TUNEPLANE_TELEMETRY_INTERVAL="1",
        TUNEPLANE_TELEMETRY_FLUSH_INTERVAL="1",
        TUNEPLANE_GPU_HEALTH_QUIET="3",
    )
    env.pop("REDIS_URL", None)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    web, gateway = f"{base}/metrics", f"http://{gateway_metrics}/metrics"
    console = Console(env, port)
    agent_process = None
    try:
        console.wait_for("Tuneplane console is up")
        made = subprocess.run(
            ["make", "--no-print-directory", "-s", "token", "USER=admin"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        token = made.stdout.strip()
        assert call("POST", f"{base}/api/fleets", token, PRODUCT_PAGE_BODY)[0] == 201
        shell = manage(
            "shell",
            "-c",
            "from audit.services import Actor; from tuneplane.services import project_create; "
            "project_create(actor=Actor.system('readme'), slug='ml', name='ML')",
            env=env,
        )
        assert shell.returncode == 0, shell.stderr
        # An admission refused: no node yet, so nothing fits.
        job = {"project": "ml", "name": "sft", "cards": 1, "command": ["true"]}
        assert call("POST", f"{base}/api/training-jobs", token, job)[0] == 422
        # A join refused: a token that does not exist.
        node_env = machine(tmp_path)
        inventory = inventory_file(tmp_path, H100_DEVICE_INVENTORY)
        refused = agent(
            "join", "--server", base, "--fleet", "gpu-lab", "--token", "tpj_not-a-token",
            "--inventory-file", inventory, env=node_env,
        )  # fmt: skip
        assert refused.returncode != 0
        after = scrape(web)
        assert after[("type", "tuneplane_admissions")] == "counter"
        assert after[("type", "tuneplane_admission_seconds")] == "histogram"
        fit = {"outcome": "refused", "reason": "inventory_fit"}
        assert labelled(after, "tuneplane_admissions_total", **fit) == 1
        assert labelled(after, "tuneplane_joins_total", outcome="refused") == 1

        status, body = call("POST", f"{base}/api/fleets/gpu-lab/join-tokens", token, {})
        joined = agent(
            "join", "--server", base, "--fleet", "gpu-lab", "--token", json.loads(body)["token"],
            "--inventory-file", inventory, env=node_env,
        )  # fmt: skip
        assert joined.returncode == 0, joined.stderr
        source = tmp_path / "telemetry.json"
        write(source)
        console.wait_for("gateway serving NodeControl")
        agent_process = serve(
            node_env, console.gateway, tmp_path, "--telemetry-file", str(source),
            inventory=H100_DEVICE_INVENTORY,
        )  # fmt: skip

        def fleet(name: str, **labels):
            return labelled(scrape(web), name, fleet="gpu-lab", **labels)

        wait_for(lambda: fleet("tuneplane_nodes", state="schedulable") == 1, what="schedulable")
        assert fleet("tuneplane_nodes_connected") == 1
        wait_for(lambda: fleet("tuneplane_gpu_cards_placeable") == 8, what="8 cards placeable")
        seen = wait_for(
            lambda: (f := scrape(gateway))
            and labelled(f, "tuneplane_gpu_temperature_celsius")
            and f,
            what="the cards on the gateway's metrics",
        )
        assert labelled(seen, "tuneplane_gateway_open_streams") == 1
        assert labelled(seen, "tuneplane_gateway_python_allocated_blocks") > 100_000
        # The worker's and beat's figures, added up by the web: its sweeps and tasks.
        figures = wait_for(
            lambda: (f := scrape(web)) and labelled(f, "tuneplane_liveness_sweep_seconds_count")
            and labelled(f, "tuneplane_celery_task_duration_seconds_count") and f,
            what="the worker's sweeps on the web's metrics",
        )  # fmt: skip
        assert figures[("type", "tuneplane_celery_task_duration_seconds")] == "histogram"

        write(source, {5: {"xid_counts": {"94": 1}}})
        wait_for(lambda: fleet("tuneplane_gpu_cards_placeable") == 7, what="the card out")
        assert fleet("tuneplane_gpu_cards", health="unhealthy") == 1
        status, body = call("GET", f"{base}/api/nodes", token)
        (shown,) = json.loads(body)["results"]
        sick = next(c for c in shown["telemetry"]["cards"] if c["uuid"] == H100_DEVICES[5]["uuid"])
        assert sick["health"] == "unhealthy" and sick["health_reason"] == "XID 94"
        wait_for(lambda: fleet("tuneplane_gpu_cards_placeable") == 8, what="the card back")
    finally:
        if agent_process is not None:
            agent_process.send_signal(15)
            agent_process.wait(20)
        assert console.stop() == 0, console.output[-3000:]
