"""A job naming an image runs from that image on a node Fleet (DESIGN §7): submitted through
the API, allocated by a real Celery worker, started by the real agent over a real gateway.
The image comes from a real dockerd of the session's own (tests/dockerd.py); the member runs
under the same OCI runtime as every confined member (R18), in its own network (R19), its logs
read back over the stream, its runtime state and root removed by the cleanup."""

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from placement.models import CardHold, Member
from tests.agent_members import free_port, listener
from tests.dockerd import IMAGE

from .agents import wait_until
from .running import answers, deploy, deployment_shown, job_shown, state_is, status_is, submit

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


def container_of(member_id: str) -> str:
    """The container docker has for it: none, ever (the image's member is not docker's)."""
    done = subprocess.run(
        ["docker", "inspect", "--format", "{{.State.Status}}", f"tuneplane-{member_id}"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def under_runtime(directory: Path, member_id: str) -> bool:
    """Whether the agent's OCI runtime still has the member (its state dir under runtime/)."""
    return any(directory.rglob(f"runtime/{member_id}"))


def root_mounted(member_id: str) -> bool:
    """Whether an overlay root of the member's is mounted anywhere on the machine."""
    return f"/bundles/{member_id}/rootfs " in Path("/proc/self/mountinfo").read_text()


CONFINED = r"runc: uid 6\d{4}; pid, ipc, uts, mount, network, cgroup namespaces; .*; image "


def test_a_job_naming_an_image_runs_in_a_container_its_logs_read_back_then_removed(
    dockerd,
    running_node,
    member_api,
):
    submitted_at = time.monotonic()
    job = submit(
        member_api,
        image=IMAGE,
        # busybox's sh: the image has no bash, and the script runs by its /bin/sh.
        script='echo "cards $CUDA_VISIBLE_DEVICES lr $LR"; echo "path $PATH"',
        env={"LR": "3e-4"},
        memory_bytes=64 << 20,
    )
    wait_until(lambda: state_is(member_api, job["id"], "running", "succeeded"), what="running")
    started = time.monotonic() - submitted_at
    done = wait_until(lambda: state_is(member_api, job["id"], "succeeded"), what="success")
    member = done["attempts"][0]["members"][0]
    assert member["exit_code"] == 0
    assert re.match(CONFINED + re.escape(IMAGE), member["confinement"])  # R18
    indices = ",".join(str(index) for index in sorted(c["index"] for c in member["cards"]))
    output = member_api.get(f"/api/training-jobs/{job['id']}/logs").json()["output"]
    assert f"cards {indices} lr 3e-4\npath /bin\n" == output  # the image's PATH: inside it
    wait_until(
        lambda: job_shown(member_api, job["id"])["attempts"][0]["members"][0]["cleanup"]
        == "cleaned",
        what="the cleanup confirmed",
    )
    member_id = Member.objects.get().command_id
    assert not under_runtime(running_node[2], member_id) and not root_mounted(member_id)
    assert container_of(member_id) == ""  # never docker's
    assert not CardHold.objects.exists()
    print(f"container job submitted → running in {started:.2f}s")


def test_R10_a_cancelled_container_job_is_stopped_by_the_runtime_and_removed(
    dockerd,
    running_node,
    member_api,
):
    job = submit(
        member_api,
        image=IMAGE,
        command=["sh", "-c", "trap 'echo term; exit 143' TERM; while :; do sleep 0.1; done"],
    )
    wait_until(lambda: state_is(member_api, job["id"], "running"), what="the job running")
    member_id = Member.objects.get().command_id
    assert under_runtime(running_node[2], member_id) and root_mounted(member_id)
    assert member_api.post(f"/api/training-jobs/{job['id']}/cancel").status_code == 200
    done = wait_until(lambda: state_is(member_api, job["id"], "cancelled"), what="cancelled")
    assert done["attempts"][0]["members"][0]["exit_code"] == 143  # its TERM trap ran
    wait_until(lambda: not CardHold.objects.exists(), what="cards released after cleanup")
    assert not under_runtime(running_node[2], member_id) and not root_mounted(member_id)


# busybox's httpd serves the working directory (the scratch dir): an index saying which port.
HTTPD = 'echo "{\\"pid\\": 0, \\"port\\": $PORT}" > index.html; exec httpd -f -p "$PORT"'


def test_S1_R19_a_replica_from_an_image_serves_through_its_mapped_port_restarted_then_removed(
    dockerd,
    serving_node,
    member_api,
):
    port = free_port()
    made = deploy(member_api, port, image=IMAGE, command=["sh", "-c", HTTPD], readiness_path="/")
    wait_until(lambda: status_is(member_api, made["id"], "ready"), 60, "ready")
    assert answers(port) == {"pid": 0, "port": port}  # PORT, mapped from the node (R19)
    member_id = Member.objects.get().command_id
    os.kill(listener(port), signal.SIGKILL)
    wait_until(lambda: status_is(member_api, made["id"], "degraded"), 30, "degraded")
    wait_until(lambda: status_is(member_api, made["id"], "ready"), 60, "ready again")
    [again] = deployment_shown(member_api, made["id"])["revisions"][0]["members"]
    assert again["restarts"] == 1
    assert re.match(CONFINED + re.escape(IMAGE), again["confinement"])  # R18
    stopped = member_api.patch(f"/api/deployments/{made['id']}", {"state": "stopped"})
    assert stopped.status_code == 200
    wait_until(
        lambda: deployment_shown(member_api, made["id"])["revisions"][0]["members"][0]["cleanup"]
        == "cleaned",
        60,
        "the replica cleaned up",
    )
    assert answers(port) is None and not root_mounted(member_id)
