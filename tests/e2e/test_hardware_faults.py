"""When hardware fails (DESIGN §9), for real: a job on a shared-mount node Fleet, run by a
real agent (as root: each member under runc with a uid of its own) through a real worker and
gateway, saves a checkpoint in $TUNEPLANE_CHECKPOINT_DIR, exits a code it listed, and its
second attempt — told it is a restart — resumes from what the first saved (H3)."""

import signal

import pytest

from audit.services import Actor
from nodes.models import ControlSession
from placement.models import Volume
from placement.services.storage import storage_create
from tests.conftest import H100_DEVICE_INVENTORY

from .agents import lay_out_a_joined_node, running_gateway, serve, wait_until
from .running import FAST, output_of, state_is, submit, worker

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]

# Resumes from its checkpoint if there is one; else saves one and asks to be tried again.
SCRIPT = """set -e
mkdir -p "$TUNEPLANE_CHECKPOINT_DIR"
echo "attempt $TUNEPLANE_ATTEMPT restart $TUNEPLANE_RESTART_COUNT"
if [ -f "$TUNEPLANE_CHECKPOINT_DIR/step" ]; then
  echo "resumed from step $(cat "$TUNEPLANE_CHECKPOINT_DIR/step")"
  exit 0
fi
echo 100 > "$TUNEPLANE_CHECKPOINT_DIR/step"
exit 75
"""


def test_H3_a_listed_exit_retries_and_the_next_attempt_resumes_from_its_checkpoint_dir(
    require_redis, tmp_path, console_pki, node_fleet, mint, member, member_api
):
    root = tmp_path / "storage"
    volume = root / "ml" / "volumes" / "ckpt"
    volume.mkdir(parents=True)
    volume.chmod(0o777)  # the volume is the job's to write, whatever uid its member runs as
    storage_create(Volume, actor=Actor.of_user(member), project="ml", name="ckpt")
    node, env, _ = lay_out_a_joined_node(node_fleet, mint, tmp_path)
    with (
        worker(tmp_path, require_redis, TUNEPLANE_STOP_GRACE="3"),
        running_gateway(tmp_path, console_pki, REDIS_URL=require_redis, **FAST) as target,
    ):
        agent = serve(
            env, target, tmp_path, "--storage-root", str(root), inventory=H100_DEVICE_INVENTORY
        )
        try:
            wait_until(
                lambda: ControlSession.objects.filter(node=node, closed_at__isnull=True).exists()
                and node.__class__.objects.get(pk=node.pk).inventory.get("devices"),
                what="the node connected with its devices",
            )
            job = submit(
                member_api,
                script=SCRIPT,
                volumes=["ckpt"],
                retry={"on_exit_codes": [75], "max_attempts": 2},
            )
            done = wait_until(
                lambda: state_is(member_api, job["id"], "succeeded", "failed"),
                90,
                what="the job ended",
            )
            attempts = [(a["number"], a["state"], a["end_class"]) for a in done["attempts"]]
            assert attempts == [(1, "failed", "user"), (2, "succeeded", "user")], done
            assert done["attempts"][0]["members"][0]["exit_code"] == 75
            output = output_of(member_api, job["id"])
            assert "attempt 2 restart 1" in output and "resumed from step 100" in output, output
            saved = volume / "checkpoints" / f"trainingjob-{job['id']}" / "step"
            assert saved.read_text() == "100\n"
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(20)
