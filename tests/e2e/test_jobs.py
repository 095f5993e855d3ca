"""Jobs run for real on a node Fleet (DESIGN §7): submitted through the API, allocated by a
real Celery worker, started by the real agent over a real gateway as real processes, their
ends and cleanups reported back. Cards by index and UUID come from a fake inventory (this
machine has no GPU); the processes, signals and cgroups are real.
"""

import json
import signal
from pathlib import Path

import pytest

from nodes.models import ControlSession
from placement.models import CardHold, Member, TrainingJob
from tests.conftest import H100_DEVICE_INVENTORY

from .agents import serve, wait_until
from .running import job_shown, output_of, release, state_is, submit

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


def test_R4_R7_a_job_runs_with_exactly_its_cards_succeeds_and_holds_them_until_cleanup(
    running_node, member_api
):
    node, _, directory, _, _ = running_node
    job = submit(
        member_api,
        command=[
            "python3",
            "-c",
            "import json, os, sys, time; print(json.dumps(dict(os.environ))); time.sleep(1)",
        ],
        env={"LEARNING_RATE": "3e-4"},
    )
    assert job["state"] == "queued"
    running = wait_until(
        lambda: state_is(member_api, job["id"], "running", "succeeded"), what="the job running"
    )
    member = running["attempts"][0]["members"][0]
    assert member["node"] == node.id and len(member["cards"]) == 2
    # R7: the cards are held while it runs.
    assert CardHold.objects.filter(node=node).count() == 2
    done = wait_until(lambda: state_is(member_api, job["id"], "succeeded"), what="success")
    attempt = done["attempts"][0]
    assert (attempt["number"], attempt["state"]) == (1, "succeeded")
    # R4: exactly its cards, in PCI bus order by index and by UUID, and the job's env.
    env = json.loads(output_of(member_api, job["id"]))
    indices = [card["index"] for card in member["cards"]]
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, sorted(indices)))
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(c["uuid"] for c in member["cards"])
    assert env["LEARNING_RATE"] == "3e-4"
    # R7: released only once the node confirmed the cleanup.
    wait_until(
        lambda: job_shown(member_api, job["id"])["attempts"][0]["members"][0]["cleanup"]
        == "cleaned",
        what="the cleanup confirmed",
    )
    assert not CardHold.objects.filter(node=node).exists()
    scratch = Path(directory) / "members" / Member.objects.get().command_id
    assert not scratch.exists()


def test_R10_a_failing_job_fails_with_its_exit_code_and_is_not_retried(running_node, member_api):
    job = submit(member_api, script="echo failing; exit 3")
    failed = wait_until(lambda: state_is(member_api, job["id"], "failed"), what="failure")
    member = failed["attempts"][0]["members"][0]
    assert (member["state"], member["exit_code"], member["reason"]) == ("failed", 3, "exit")
    assert failed["reason"] == "exit" and len(failed["attempts"]) == 1  # R9: no retry on exit


def test_R10_cancel_stops_a_running_job_and_it_ends_cancelled(running_node, member_api):
    job = submit(
        member_api,
        script="trap 'echo term; exit 143' TERM; while true; do sleep 0.1; done",
    )
    wait_until(lambda: state_is(member_api, job["id"], "running"), what="the job running")
    response = member_api.post(f"/api/training-jobs/{job['id']}/cancel")
    assert response.status_code == 200, response.content
    done = wait_until(lambda: state_is(member_api, job["id"], "cancelled"), what="cancelled")
    assert output_of(member_api, job["id"]).split()[-1] == "term"  # SIGTERM reached it
    assert done["attempts"][0]["state"] == "cancelled"
    wait_until(lambda: not CardHold.objects.exists(), what="cards released after cleanup")


def test_R6_a_killed_agent_takes_no_work_with_it_and_the_exit_is_recorded_once(
    running_node, member_api, tmp_path
):
    node, env, directory, target, agent = running_node
    job = submit(
        member_api,
        script='while [ ! -e "$TUNEPLANE_SCRATCH_DIR/release" ]; do sleep 0.1; done; exit 0',
    )
    wait_until(lambda: state_is(member_api, job["id"], "running"), what="the job running")
    agent.send_signal(signal.SIGKILL)
    agent.wait(10)
    release(directory)  # it finishes while no agent watches
    assert TrainingJob.objects.get(pk=job["id"]).state == "running"
    again = serve(env, target, tmp_path, inventory=H100_DEVICE_INVENTORY)
    try:
        done = wait_until(lambda: state_is(member_api, job["id"], "succeeded"), what="success")
        assert done["attempts"][0]["members"][0]["exit_code"] == 0
        assert len(done["attempts"]) == 1
    finally:
        again.send_signal(signal.SIGTERM)
        again.wait(20)


def test_R11_a_job_runs_as_a_uid_of_its_own_in_its_own_pid_namespace(
    running_node, member_api, tmp_path
):
    """The real agent as it runs by default on a machine (root, members confined): a job's
    process is not root, sees only its own processes, and the console is told its uid."""
    node, env, _, target, agent = running_node
    agent.send_signal(signal.SIGTERM)
    agent.wait(20)
    confined = serve(
        env, target, tmp_path, inventory=H100_DEVICE_INVENTORY, member_uids="61100-61199"
    )
    try:
        wait_until(
            lambda: ControlSession.objects.filter(node=node, closed_at__isnull=True).exists(),
            what="the confined agent connected",
        )
        # A script: run by its name in the scratch dir, which its uid may not reach by path
        # here (the agent's state dir is under pytest's private tmp dir).
        job = submit(member_api, cards=1, script="id -u; ls -d /proc/[0-9]* | wc -l")
        done = wait_until(lambda: state_is(member_api, job["id"], "succeeded"), what="success")
        [member] = done["attempts"][0]["members"]
        assert "uid 611" in member["confinement"], member["confinement"]
        uid, seen = member_api.get(f"/api/training-jobs/{job['id']}/logs").json()["output"].split()
        assert 61100 <= int(uid) <= 61199 and int(seen) < 10
    finally:
        confined.send_signal(signal.SIGTERM)
        confined.wait(20)


def test_logs_are_read_from_the_node_over_its_stream_and_a_503_when_it_is_not_connected(
    running_node, member_api, client, admin_user
):
    node, _, _, _, agent = running_node
    job = submit(member_api, script="for i in 1 2 3; do echo line-$i; done; echo '<b>oops</b>' >&2")
    wait_until(lambda: state_is(member_api, job["id"], "succeeded"), what="success")
    response = member_api.get(f"/api/training-jobs/{job['id']}/logs")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["output"] == "line-1\nline-2\nline-3\n<b>oops</b>\n"
    # The admin's job page frames the same tail, escaped; it no longer refreshes once ended.
    client.force_login(admin_user)
    page = client.get(f"/admin/placement/trainingjob/{job['id']}/change/").content.decode()
    assert f"/admin/placement/trainingjob/{job['id']}/output/" in page
    framed = client.get(f"/admin/placement/trainingjob/{job['id']}/output/").content.decode()
    assert "line-1\nline-2\nline-3\n&lt;b&gt;oops&lt;/b&gt;" in framed
    assert 'http-equiv="refresh"' not in framed
    assert (body["attempt"], body["rank"], body["node"]) == (1, 0, node.id)
    tail = member_api.get(f"/api/training-jobs/{job['id']}/logs?tail_bytes=5").json()
    assert tail["output"] == "</b>\n"
    assert member_api.get(f"/api/training-jobs/{job['id']}/logs?rank=1").status_code == 404
    assert member_api.get(f"/api/training-jobs/{job['id']}/logs?tail_bytes=0").status_code == 400
    agent.send_signal(signal.SIGTERM)
    agent.wait(20)
    wait_until(
        lambda: not ControlSession.objects.filter(node=node, closed_at__isnull=True).exists(),
        what="the stream closed",
    )
    gone = member_api.get(f"/api/training-jobs/{job['id']}/logs")
    assert gone.status_code == 503 and gone.json()["error"]["code"] == "node_not_connected"
    framed = client.get(f"/admin/placement/trainingjob/{job['id']}/output/")
    assert framed.status_code == 200 and "is not connected" in framed.content.decode()
