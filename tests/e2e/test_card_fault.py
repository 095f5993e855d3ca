"""A card fails under a running job, for real (issue 48: H1, H2, H3, H6): a shared-mount node
Fleet, a real agent as root (its member under runc) reading a fake telemetry source, a real
gateway and worker. The job saves a checkpoint and marks it; a fatal XID on its card then
quarantines the card, stops the member (SIGTERM), ends the attempt `infrastructure` without
spending `max_attempts: 1`, and places the job again on another card, where its second
attempt — TUNEPLANE_RESTART_COUNT=1 — resumes from its checkpoint dir."""

import signal
import time
from contextlib import contextmanager

import pytest

from audit.services import Actor
from nodes.models import ControlSession, Node
from placement.models import Member, Volume
from placement.services.storage import storage_create
from tests.conftest import H100_DEVICE_INVENTORY

from .agents import lay_out_a_joined_node, running_gateway, serve, wait_until
from .running import FAST, output_of, state_is, submit, worker
from .test_telemetry import write

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]

# Resumes from its checkpoint if there is one; else saves one, marks it (H4) and works on.
SCRIPT = """set -e
mkdir -p "$TUNEPLANE_CHECKPOINT_DIR"
echo "attempt $TUNEPLANE_ATTEMPT restart $TUNEPLANE_RESTART_COUNT on $CUDA_VISIBLE_DEVICES"
if [ -f "$TUNEPLANE_CHECKPOINT_DIR/step" ]; then
  echo "resumed from step $(cat "$TUNEPLANE_CHECKPOINT_DIR/step")"
  exit 0
fi
echo 100 > "$TUNEPLANE_CHECKPOINT_DIR/step"
touch "$TUNEPLANE_CHECKPOINT_MARK"
trap 'echo "term at $(date +%s.%N)"; exit 143' TERM
echo working
while :; do sleep 0.1; done
"""
HEALTH = {
    "TUNEPLANE_TELEMETRY_INTERVAL": "1",
    "TUNEPLANE_TELEMETRY_FLUSH_INTERVAL": "1",
    "TUNEPLANE_HEALTH_BREAKER_SHARE": "1",
    "TUNEPLANE_INFRA_BACKOFF_FIRST": "0",
    "TUNEPLANE_STOP_GRACE": "3",
}


@contextmanager
def faulting_node(tmp_path, console_pki, node_fleet, mint, member, redis_url):
    """A shared-mount node Fleet's node whose agent (as root) reads ``source`` as its cards'
    telemetry, with a real worker and gateway, a volume `ckpt` for the job's checkpoints:
    (node, source) once it is connected with its devices."""
    root = tmp_path / "storage"
    volume = root / "ml" / "volumes" / "ckpt"
    volume.mkdir(parents=True)
    volume.chmod(0o777)  # the volume is the job's to write, whatever uid its member runs as
    storage_create(Volume, actor=Actor.of_user(member), project="ml", name="ckpt")
    node, env, _ = lay_out_a_joined_node(node_fleet, mint, tmp_path)
    source = tmp_path / "telemetry.json"
    write(source)
    with (
        worker(tmp_path, redis_url, **HEALTH),
        running_gateway(tmp_path, console_pki, REDIS_URL=redis_url, **FAST, **HEALTH) as to,
    ):
        agent = serve(
            env,
            to,
            tmp_path,
            "--storage-root",
            str(root),
            "--telemetry-file",
            str(source),
            inventory=H100_DEVICE_INVENTORY,
        )
        try:
            wait_until(
                lambda: ControlSession.objects.filter(node=node, closed_at__isnull=True).exists()
                and Node.objects.get(pk=node.pk).inventory.get("devices"),
                what="the node connected with its devices",
            )
            yield node, source
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(20)


def test_H6_H1_H2_H3_a_fatal_xid_stops_the_job_which_resumes_on_another_card_unspent(
    require_redis, tmp_path, console_pki, node_fleet, mint, member, member_api, capsys
):
    with faulting_node(tmp_path, console_pki, node_fleet, mint, member, require_redis) as (
        node,
        source,
    ):
        job = submit(member_api, cards=1, script=SCRIPT, volumes=["ckpt"], max_attempts=1)
        first = wait_until(
            lambda: Member.objects.filter(
                attempt__training_job_id=job["id"], attempt__number=1, state="running"
            ).first(),
            60,
            what="attempt 1 running",
        )
        wait_until(lambda: "working" in output_of(member_api, job["id"]), 30, what="working")
        wait_until(
            lambda: Member.objects.get(pk=first.pk).checkpointed_at is not None,
            30,
            what="its checkpoint mark reported (H4)",
        )
        index = first.cards[0]["index"]
        faulted_at = time.time()
        write(source, {index: {"xid_counts": {"79": 1}}})  # the card falls off the bus
        ended = wait_until(
            lambda: (m := Member.objects.get(pk=first.pk)).state not in ("running",) and m,
            60,
            what="the member stopped",
        )
        stopped_after = time.time() - faulted_at
        assert ended.exit_code == 143, (ended.state, ended.reason, ended.exit_code)
        quarantined = Node.objects.get(pk=node.pk).unhealthy_cards
        assert first.cards[0]["uuid"] in quarantined, quarantined
        done = wait_until(
            lambda: state_is(member_api, job["id"], "succeeded", "failed"),
            90,
            what="the job ended",
        )
        attempts = [(a["number"], a["end_class"]) for a in done["attempts"]]
        assert done["state"] == "succeeded", done
        assert attempts == [(1, "infrastructure"), (2, "user")], done
        assert done["attempts"][0]["work_lost_seconds"] is not None
        second = done["attempts"][1]["members"][0]["cards"]
        assert [card["index"] for card in second] != [index]  # the failed card excluded
        output = output_of(member_api, job["id"])
        assert "attempt 2 restart 1" in output and "resumed from step 100" in output, output
    with capsys.disabled():
        print(f"\nfatal XID written -> member ended (SIGTERM'd): {stopped_after:.2f} s")
