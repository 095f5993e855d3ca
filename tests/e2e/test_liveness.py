"""Liveness for real: beat schedules, a worker sweeps, a gateway holds a real agent's stream.

The agent is SIGKILLed and the node is watched through the API as it goes quiet for
serve (L2), then gone on the train threshold (L4) — thresholds shortened to seconds. A
deployment degrading while its node is quiet is tests/e2e/test_deployments.py (S3).
"""

import signal
import time

import pytest
from django_celery_beat.models import PeriodicTask

from tuneplane.schedule import seed_schedule

from .agents import lay_out_a_joined_node, running_gateway, serve, wait_until
from .running import SHORT, sweepers, sweeping_console

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


def test_schedule_is_seeded_with_an_expiry_and_keeps_a_pause(settings):
    settings.TUNEPLANE_SWEEP_INTERVAL = 7
    seed_schedule()
    task = PeriodicTask.objects.get(name="Liveness sweep")
    assert (task.task, task.interval.every, task.expire_seconds) == ("nodes.liveness_sweep", 7, 7)
    PeriodicTask.objects.filter(pk=task.pk).update(enabled=False)
    seed_schedule()
    assert PeriodicTask.objects.get(pk=task.pk).enabled is False  # an admin's pause stays


def test_a_killed_agent_goes_quiet_for_serve_then_gone(
    require_redis, tmp_path, console_pki, settings, make_fleet, mint, admin_api
):
    settings.TUNEPLANE_SWEEP_INTERVAL = 1
    fleet = make_fleet("gpu-lab", kind="node", capabilities=["train", "serve"])
    node, env, _ = lay_out_a_joined_node(fleet, mint, tmp_path)
    with sweeping_console(tmp_path, console_pki, require_redis) as target:
        agent = serve(env, target, tmp_path)
        try:

            def node_shown():
                return admin_api.get(f"/api/nodes/{node.id}").json()

            wait_until(
                lambda: node_shown()["scheduling"]["state"] == "schedulable",
                what="the node schedulable",
            )
            assert node_shown()["liveness"] == {"train": "ok", "serve": "ok"}
        finally:
            agent.send_signal(signal.SIGKILL)
            agent.wait(10)
        quiet = wait_until(
            lambda: (lambda body: body if body["liveness"]["serve"] == "quiet" else None)(
                node_shown()
            ),
            what="serve quiet",
        )
        assert quiet["scheduling"]["state"] == "schedulable"  # not gone at serve's 2 s (train's 20)
        assert quiet["liveness"]["train"] == "ok"
        gone = wait_until(
            lambda: (lambda body: body if body["scheduling"]["state"] == "gone" else None)(
                node_shown()
            ),
            what="gone",
            timeout=60,
        )
        assert gone["liveness"] == {"train": "quiet", "serve": "quiet"}


def test_grace_a_console_outage_is_not_a_fleet_outage(
    require_redis, tmp_path, console_pki, make_fleet, mint, admin_api
):
    """The node's agent and the gateway die together; the worker and beat sweep on. While no
    gateway listens, and for the train threshold after one is back, the silent node is not
    gone: the console heard nothing, which is not evidence. Then it is."""
    fleet = make_fleet("gpu-lab", kind="node", capabilities=["train", "serve"])
    node, env, _ = lay_out_a_joined_node(fleet, mint, tmp_path)

    def state():
        return admin_api.get(f"/api/nodes/{node.id}").json()["scheduling"]["state"]

    with sweepers(tmp_path, require_redis):
        with running_gateway(tmp_path, console_pki, REDIS_URL=require_redis, **SHORT) as target:
            agent = serve(env, target, tmp_path)
            wait_until(lambda: state() == "schedulable", what="the node schedulable")
            agent.send_signal(signal.SIGKILL)
            agent.wait(10)
        time.sleep(12)  # no gateway: beyond the train threshold (8 s)
        assert state() == "schedulable"
        with running_gateway(tmp_path, console_pki, REDIS_URL=require_redis, **SHORT):
            time.sleep(5)  # listening, for less than the train threshold
            assert state() == "schedulable"
            wait_until(lambda: state() == "gone", what="gone once heard", timeout=30)
