"""Commands over the real stream, reconcile at reconnect (L5), storage cordon (L6), removal (D4).

A real grpcserve (or two), the real agent, real processes killed for real.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from nodes.agent.command import process_start_time
from nodes.models import ControlSession, NodeCommand, StrayCommand

from .agents import connect, credentials, running_gateway, serve, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def waiter(tmp_path: Path, name: str) -> list[str]:
    """argv of a process that says it started, waits for a release file (two minutes at
    most, so that a failed test leaves nothing running), then says it ended."""
    return [
        "sh",
        "-c",
        f"echo $$ > {tmp_path}/{name}.started; i=0; "
        f"while [ ! -e {tmp_path}/{name}.release ] && [ $i -lt 1200 ]; "
        "do sleep 0.1; i=$((i+1)); done; "
        f"echo done > {tmp_path}/{name}.finished",
    ]


def send(admin_api, node, argv) -> str:
    response = admin_api.post(
        f"/api/nodes/{node.id}/commands", {"kind": "run", "payload": {"argv": argv}}
    )
    assert response.status_code == 201, response.content
    return response.json()["id"]


def state_of(command_id: str) -> str:
    return NodeCommand.objects.get(pk=command_id).state


def connected(node):
    return wait_until(
        lambda: ControlSession.objects.filter(node=node, closed_at__isnull=True).first(),
        what="an open session",
    )


def kill(agent) -> None:
    agent.send_signal(signal.SIGKILL)
    agent.wait(10)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def stop(agent) -> str:
    agent.send_signal(signal.SIGTERM)
    return agent.communicate(timeout=20)[0]


def test_L5_work_outlives_its_agent_and_a_finish_while_disconnected_is_recorded(
    gateway, joined, admin_api, tmp_path
):
    node, env, _ = joined
    agent = serve(env, gateway, tmp_path)
    connected(node)
    command = send(admin_api, node, waiter(tmp_path, "job"))
    wait_until(lambda: state_of(command) == "running", what="the command running")
    pid = int(
        wait_until(
            lambda: (tmp_path / "job.started").exists()
            and (tmp_path / "job.started").read_text().strip(),
            what="its process",
        )
    )
    kill(agent)
    wait_until(
        lambda: not ControlSession.objects.filter(node=node, closed_at__isnull=True).exists(),
        what="the session to close",
    )
    # L5: the stream is gone; the process and the console's record of it are not.
    assert alive(pid) and state_of(command) == "running"
    (tmp_path / "job.release").touch()
    wait_until(lambda: (tmp_path / "job.finished").exists(), what="the process to finish")
    assert state_of(command) == "running"  # nobody has told the console yet

    agent = serve(env, gateway, tmp_path)
    try:
        wait_until(lambda: state_of(command) == "succeeded", what="the finish reconciled")
        assert NodeCommand.objects.get(pk=command).exit_code == 0
    finally:
        stop(agent)


def test_L5_reconnect_reconciles_running_lost_stray_and_undelivered(
    gateway, joined, admin_api, tmp_path
):
    node, env, directory = joined
    agent = serve(env, gateway, tmp_path)
    connected(node)
    keeps = send(admin_api, node, waiter(tmp_path, "keeps"))
    forgotten = send(admin_api, node, waiter(tmp_path, "forgotten"))
    wait_until(lambda: {state_of(keeps), state_of(forgotten)} == {"running"}, what="both running")
    kill(agent)
    wait_until(
        lambda: not ControlSession.objects.filter(node=node, closed_at__isnull=True).exists(),
        what="the session to close",
    )

    # While the node is away: it loses one command's record, it runs a process the console
    # never gave it, and the console is asked for one more command.
    (directory / "commands" / f"{forgotten}.json").unlink()
    stranger = subprocess.Popen(["sleep", "120"], start_new_session=True)
    (directory / "commands" / "c-started-by-hand.json").write_text(
        json.dumps(
            {
                "command_id": "c-started-by-hand",
                "kind": "run",
                "argv": ["sleep", "120"],
                "state": "running",
                "exit_code": None,
                "pid": stranger.pid,
                "started": process_start_time(stranger.pid),
            }
        )
    )
    undelivered = send(admin_api, node, ["sh", "-c", f"echo hi > {tmp_path}/late.finished"])
    assert state_of(undelivered) == "pending"

    agent = serve(env, gateway, tmp_path)
    try:
        wait_until(lambda: state_of(forgotten) == "lost", what="the forgotten one lost")
        wait_until(lambda: state_of(undelivered) == "succeeded", what="the late one delivered")
        stray = wait_until(
            lambda: StrayCommand.objects.filter(node=node).first(), what="the stray flagged"
        )
        assert (stray.command_id, stray.state) == ("c-started-by-hand", "running")
        assert state_of(keeps) == "running"
        keeps_pid = int((tmp_path / "keeps.started").read_text())
        # Flagged and reconciled, never killed.
        assert alive(stranger.pid) and alive(keeps_pid)
        (tmp_path / "keeps.release").touch()
        wait_until(lambda: state_of(keeps) == "succeeded", what="the kept one finishing")
    finally:
        stop(agent)
        stranger.kill()
        stranger.wait()
        (tmp_path / "forgotten.release").touch()


@pytest.mark.redis
def test_a_command_reaches_its_node_on_another_replica_through_redis(
    require_redis, tmp_path, console_pki, joined, admin_api
):
    node, env, _ = joined
    # Polling is slowed to a minute, so only the Redis event can deliver in time.
    slow_poll = {"TUNEPLANE_COMMAND_POLL_INTERVAL": "60", "REDIS_URL": require_redis}
    with (
        running_gateway(tmp_path / "a", console_pki, **slow_poll),
        running_gateway(tmp_path / "b", console_pki, **slow_poll) as replica_b,
    ):
        agent = serve(env, replica_b, tmp_path)
        try:
            session = connected(node)
            assert session.gateway.endswith(replica_b)
            command = send(admin_api, node, ["sh", "-c", f"echo hi > {tmp_path}/b.finished"])
            wait_until(
                lambda: state_of(command) == "succeeded", timeout=15, what="delivery through Redis"
            )
        finally:
            stop(agent)


def test_D4_removal_closes_the_open_stream_and_refuses_the_next(
    gateway, joined, admin_api, tmp_path
):
    node, env, directory = joined
    agent = serve(env, gateway, tmp_path)
    try:
        connected(node)
        assert (
            admin_api.post(f"/api/nodes/{node.id}/drain", {"reason": "leaving the rack"}).json()[
                "scheduling"
            ]["state"]
            == "drained"
        )
        assert admin_api.delete(f"/api/nodes/{node.id}").status_code == 200
        # With Redis at once; without it at the next lease flush (TUNEPLANE_HEARTBEAT_FLUSH_*).
        agent.wait_for("console closed the stream: ")
        agent.wait_for("PERMISSION_DENIED")  # its reconnect is refused
        refused = connect(gateway, credentials(directory), node.id)
        assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        stop(agent)
    assert not ControlSession.objects.filter(node=node, closed_at__isnull=True).exists()


def test_L6_storage_root_lost_and_back_moves_only_the_storage_cordon(
    gateway, joined, admin_api, tmp_path
):
    node, env, _ = joined
    mount = tmp_path / "mnt"
    mount.mkdir()
    agent = serve(env, gateway, tmp_path, "--storage-root", str(mount))
    try:
        connected(node)
        admin_api.post(f"/api/nodes/{node.id}/cordon", {"reason": "firmware update"})

        def cordons():
            body = admin_api.get(f"/api/nodes/{node.id}").json()["scheduling"]
            return {c["source"]: c["reason"] for c in body["cordons"]}

        assert cordons() == {"operator": "firmware update"}
        mount.rename(tmp_path / "unmounted")
        wait_until(lambda: "storage" in cordons(), what="the storage cordon")
        assert cordons()["operator"] == "firmware update"
        (tmp_path / "unmounted").rename(mount)
        wait_until(lambda: "storage" not in cordons(), what="the storage cordon lifted")
        assert cordons() == {"operator": "firmware update"}
    finally:
        stop(agent)


def test_D1_no_verb_stops_running_work_and_drain_completes_when_it_ends(
    gateway, joined, admin_api, tmp_path
):
    node, env, _ = joined
    agent = serve(env, gateway, tmp_path)
    try:
        connected(node)
        command = send(admin_api, node, waiter(tmp_path, "work"))
        wait_until(lambda: state_of(command) == "running", what="the command running")
        pid = int(
            wait_until(
                lambda: (tmp_path / "work.started").exists()
                and (tmp_path / "work.started").read_text().strip(),
                what="its process",
            )
        )
        verbs = [
            ("post", f"/api/nodes/{node.id}/cordon", {"reason": "maintenance"}),
            ("post", f"/api/nodes/{node.id}/uncordon", None),
            ("patch", "/api/fleets/gpu-lab", {"state": "draining"}),
            ("patch", "/api/fleets/gpu-lab", {"state": "disabled"}),
            ("patch", "/api/fleets/gpu-lab", {"state": "active"}),
            ("post", f"/api/nodes/{node.id}/drain", {"reason": "leaving the rack"}),
        ]
        for method, path, body in verbs:
            response = getattr(admin_api, method)(path, body)
            assert response.status_code == 200, (path, response.content)
            time.sleep(1.5)  # a heartbeat or more, for anything that would react
            assert alive(pid) and state_of(command) == "running", path
        assert admin_api.get(f"/api/nodes/{node.id}").json()["scheduling"]["state"] == "draining"
        assert admin_api.delete(f"/api/nodes/{node.id}").json()["error"]["rule"] == "D2"
        (tmp_path / "work.release").touch()
        wait_until(lambda: state_of(command) == "succeeded", what="the work finishing")
        wait_until(
            lambda: admin_api.get(f"/api/nodes/{node.id}").json()["scheduling"]["state"]
            == "drained",
            what="drained once idle",
        )
        assert admin_api.delete(f"/api/nodes/{node.id}").status_code == 200
    finally:
        stop(agent)
        (tmp_path / "work.release").touch()
