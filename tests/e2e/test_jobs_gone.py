"""A node gone and back, for real (DESIGN §7, R8, R9): a job's agent is SIGKILLed — its member
runs on, as a process does when its agent dies — the liveness sweep declares the node gone,
and the real agent comes back before the reconcile deadline (the attempt simply continues)
or after it (the job was retried on the other node; what still ran is stopped and cleaned,
audited). Sweeps and reconciliation run here on the real clock; the worker allocates."""

import signal
from contextlib import ExitStack

import pytest

from audit.models import AuditEvent
from nodes.agent.member import cgroups as agent_cgroups
from nodes.models import Node
from nodes.services.liveness import liveness_sweep
from placement.models import Member
from placement.services.reconcile import members_reconcile
from tests.conftest import H100_DEVICE_INVENTORY

from .agents import lay_out_a_joined_node, running_gateway, serve, wait_until
from .running import FAST, job_shown, state_is, submit, worker
from .test_jobs_outages import connected

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def restartable_agents(require_redis, tmp_path, console_pki, node_fleet, mint, settings):
    """Two nodes, each a real agent that a test may kill and start again; thresholds in
    seconds for the sweeps this test process runs."""
    settings.TUNEPLANE_QUIET_SERVE = settings.TUNEPLANE_QUIET_ENV = 2
    settings.TUNEPLANE_QUIET_TRAIN = 4
    laid = [lay_out_a_joined_node(node_fleet, mint, tmp_path, f"gpu-0{n}") for n in (1, 2)]
    with ExitStack() as stack:
        stack.enter_context(worker(tmp_path, require_redis))
        target = stack.enter_context(
            running_gateway(tmp_path, console_pki, REDIS_URL=require_redis, **FAST)
        )
        agents: dict[str, object] = {}

        def start(node_id: str):
            n, (node, env, _) = next((n, x) for n, x in enumerate(laid) if x[0].id == node_id)
            devices = tmp_path / f"devices-{n}-{len(agents)}"
            devices.mkdir()
            agents[node_id] = serve(env, target, devices, inventory=H100_DEVICE_INVENTORY)
            wait_until(lambda: connected(node), what=f"{node_id} connected")

        def kill(node_id: str):
            agents[node_id].send_signal(signal.SIGKILL)
            agents[node_id].wait(10)

        for node, _, _ in laid:
            start(node.id)
        try:
            yield start, kill
        finally:
            for agent in agents.values():
                if agent.returncode is None:
                    agent.send_signal(signal.SIGTERM)
                    agent.wait(20)
            for node, _, _ in laid:  # what a killed agent's members left running
                for member_id in agent_cgroups.cgroup_members(node.id):
                    agent_cgroups.signal_member(None, f"{node.id}/{member_id}", signal.SIGKILL)
                    agent_cgroups.release(f"{node.id}/{member_id}")


def sweep_until(check, what: str, timeout: float = 60):
    def swept():
        liveness_sweep()
        members_reconcile()
        return check()

    return wait_until(swept, timeout, what=what)


def running_member(member_api, job_id):
    job = wait_until(lambda: state_is(member_api, job_id, "running"), 40, what="running")
    return Member.objects.get(attempt__training_job_id=job_id, attempt__number=1), job


def test_R8_a_node_back_before_the_deadline_running_the_member_just_continues(
    restartable_agents, member_api, settings
):
    start, kill = restartable_agents
    settings.TUNEPLANE_RECONCILE_DEADLINE = 600
    job = submit(member_api, cards=1, command=["sleep", "600"])
    member, _ = running_member(member_api, job["id"])
    kill(member.node_id)  # the member's process runs on without its agent
    sweep_until(lambda: Member.objects.get(pk=member.pk).state == "unknown", "the member unknown")
    assert Node.objects.get(pk=member.node_id).scheduling_state == "gone"
    start(member.node_id)
    sweep_until(lambda: Member.objects.get(pk=member.pk).state == "running", "running again")
    body = job_shown(member_api, job["id"])
    assert body["state"] == "running" and len(body["attempts"]) == 1  # no retry, no kill
    assert member_api.post(f"/api/training-jobs/{job['id']}/cancel").status_code == 200


def test_R8_R9_past_the_deadline_it_is_retried_elsewhere_and_the_leftover_stopped_and_cleaned(
    restartable_agents, member_api, settings
):
    start, kill = restartable_agents
    settings.TUNEPLANE_RECONCILE_DEADLINE = 2
    settings.TUNEPLANE_INFRA_BACKOFF_FIRST = 0  # H2: a lost attempt's retry waits none here
    job = submit(member_api, cards=1, command=["sleep", "600"])
    member, _ = running_member(member_api, job["id"])
    kill(member.node_id)
    sweep_until(lambda: Member.objects.get(pk=member.pk).state == "lost", "the member lost")
    second = wait_until(
        lambda: Member.objects.filter(
            attempt__training_job_id=job["id"], attempt__number=2, state="running"
        ).first(),
        60,
        what="attempt 2 running",
    )
    assert second.node_id != member.node_id  # retried on the node that answers
    start(member.node_id)  # back, still running what was given up
    wait_until(
        lambda: Member.objects.get(pk=member.pk).cleanup == "cleaned", 60, what="leftover cleaned"
    )
    assert AuditEvent.objects.filter(
        action="member.leftover_running", target_id=str(member.pk)
    ).exists()
    assert not agent_cgroups.live_pids(f"{member.node_id}/{member.command_id}")
    body = job_shown(member_api, job["id"])
    assert body["state"] == "running" and [a["state"] for a in body["attempts"]] == [
        "lost",
        "running",
    ]  # the given-up attempt never counts again
    assert member_api.post(f"/api/training-jobs/{job['id']}/cancel").status_code == 200
