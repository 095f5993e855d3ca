"""`make bench`: deployments on node Fleets (DESIGN §7, S1). Not timed tests: they print what
they measure.

- Submit to Ready: p50 and max from the API's answer to the deployment reading ``ready``,
  with a trivial HTTP server as the replica, through a real worker, gateway and agent.
- Quiet when nothing changes: rows the console's database writes per second (inserted,
  updated, deleted: PostgreSQL's own counters) over a window with 10 replicas on 10 agents,
  then with 100 — readiness is reported on change, never polled into rows.
"""

import os
import signal
import statistics
import time

import pytest
from django.db import connection

from audit.services import Actor
from nodes.models import ControlSession, Node
from placement.models import CardHold, Deployment, Member
from placement.selectors import deployments_with_status
from placement.services import submission
from tests.agent_members import SERVER, free_port, listener
from tests.conftest import H100_DEVICE_INVENTORY
from tests.e2e.agents import lay_out_a_joined_node, serve, wait_until
from tests.e2e.running import ROLLOUT, sweeping_console

pytestmark = [pytest.mark.bench, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

SUBMISSIONS = int(os.environ.get("BENCH_DEPLOYMENTS", 20))
AGENTS = int(os.environ.get("BENCH_SERVING_AGENTS", 10))
WINDOW = float(os.environ.get("BENCH_QUIET_WINDOW", 30))
TEN_CPUS = {**H100_DEVICE_INVENTORY, "cpu_budget": 10}


def _status(deployment_id) -> str:
    return deployments_with_status(Deployment.objects.filter(pk=deployment_id)).get().status


def test_bench_submit_to_ready_with_a_trivial_http_server(serving_node, member_api, capsys):
    samples = []
    for n in range(SUBMISSIONS):
        response = member_api.post(
            "/api/deployments",
            {
                "project": "ml",
                "name": f"b{n}",
                "cards": 1,
                "command": ["python3", "-c", SERVER],
                "port": free_port(),
                "readiness_path": "/health",
            },
        )
        assert response.status_code == 201, response.content
        answered = time.perf_counter()
        deployment_id = response.json()["id"]
        while _status(deployment_id) != "ready":
            time.sleep(0.01)
            assert time.perf_counter() - answered < 60, "not Ready within 60 s"
        samples.append(time.perf_counter() - answered)
        member_api.patch(f"/api/deployments/{deployment_id}", {"state": "stopped"})
        while CardHold.objects.filter(member__revision__deployment_id=deployment_id).exists():
            time.sleep(0.02)  # its card back before the next one is measured
    ordered = sorted(samples)
    with capsys.disabled():
        print(
            f"\nsubmit -> Ready ({SUBMISSIONS} deployments of one replica, a trivial HTTP "
            f"server; worker + beat + gateway + agent on this machine): p50 "
            f"{statistics.median(ordered) * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms"
        )


def _rows_written() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tup_inserted + tup_updated + tup_deleted FROM pg_stat_database "
            "WHERE datname = current_database()"
        )
        return cursor.fetchone()[0]


def _writes_per_second() -> float:
    time.sleep(2)  # counters are flushed at the end of each backend's transactions
    before = _rows_written()
    time.sleep(WINDOW)
    return (_rows_written() - before) / WINDOW


def _deploy(member, name) -> Deployment:
    """One replica on a port of its own (every agent here is on this one machine), a CPU
    of its node's ten: the allocator fills the nodes ten replicas each."""
    return submission.deployment_submit(
        actor=Actor.of_user(member),
        project="ml",
        name=name,
        cards=0,
        command=["python3", "-c", SERVER],
        port=free_port(),
        readiness_path="/health",
        cpus=1.0,
    )


def test_bench_database_writes_do_not_grow_with_replicas_when_nothing_changes(
    require_redis, tmp_path, console_pki, make_fleet, mint, member, settings, capsys
):
    settings.TUNEPLANE_SWEEP_INTERVAL = 1
    fleet = make_fleet("serve-lab", kind="node", capabilities=["serve"])
    nodes = [lay_out_a_joined_node(fleet, mint, tmp_path, f"gpu-{i:02d}") for i in range(AGENTS)]
    agents = []
    with sweeping_console(tmp_path, console_pki, require_redis, ROLLOUT) as target:
        try:
            for _, env, _ in nodes:
                agents.append(serve(env, target, tmp_path, inventory=TEN_CPUS))
            wait_until(
                lambda: ControlSession.objects.filter(closed_at__isnull=True).count() == AGENTS,
                60,
                "every agent connected",
            )
            figures = []
            deployments = []
            for count in (AGENTS, AGENTS * 10):
                while len(deployments) < count:
                    deployments.append(_deploy(member, f"d{len(deployments)}"))
                wait_until(
                    lambda: all(_status(d.pk) == "ready" for d in deployments),
                    300,
                    f"{count} replicas Ready",
                )
                figures.append((count, _writes_per_second()))
        finally:
            for agent in agents:
                agent.send_signal(signal.SIGTERM)
                agent.wait(20)
            for replica in Member.objects.filter(port__isnull=False):
                pid = listener(replica.port)
                if pid:
                    os.kill(pid, signal.SIGKILL)
    with capsys.disabled():
        print(
            f"\nrows written per second with nothing changing ({AGENTS} agents, heartbeat "
            f"1 s, beat sweeping every second, {WINDOW:.0f} s windows): "
            + ", ".join(f"{n} replicas: {rate:.1f}/s" for n, rate in figures)
        )
    assert Node.objects.count() == AGENTS
