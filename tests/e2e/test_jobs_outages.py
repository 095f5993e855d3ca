"""Jobs through outages and in gangs, for real (DESIGN §7): the gateway killed mid-job (R6),
a cancel that reaches a member before it has started (R10), two real agents running a gang
with its rendezvous env, a gang member failing (R3), a gang whose second member never starts
(the gang deadline, R3)."""

import json
import signal
from contextlib import ExitStack

import pytest

from nodes.agent.member import cgroups as agent_cgroups
from nodes.models import ControlSession, Node, NodeCommand
from placement.models import Attempt, CardHold
from placement.services.reconcile import members_reconcile
from tests.conftest import H100_DEVICE_INVENTORY

from .agents import lay_out_a_joined_node, running_gateway, serve, start_gateway, wait_until
from .console import free_port
from .running import FAST, job_shown, output_of, release, state_is, submit, worker

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


def connected(node) -> bool:
    return ControlSession.objects.filter(node=node, closed_at__isnull=True).exists() and bool(
        Node.objects.get(pk=node.pk).inventory.get("devices")
    )


def test_R6_a_gateway_killed_mid_job_changes_nothing_and_the_exit_is_recorded_once(
    require_redis, tmp_path, console_pki, node_fleet, mint, member_api
):
    node, env, directory = lay_out_a_joined_node(node_fleet, mint, tmp_path)
    port = free_port()
    settings = {"REDIS_URL": require_redis, **FAST}
    with worker(tmp_path, require_redis):
        gateway, _ = start_gateway(tmp_path, console_pki, port, **settings)
        agent = serve(env, f"127.0.0.1:{port}", tmp_path, inventory=H100_DEVICE_INVENTORY)
        try:
            wait_until(lambda: connected(node), what="the node connected")
            wait = 'while [ ! -e "$TUNEPLANE_SCRATCH_DIR/release" ]; do sleep 0.1; done'
            job = submit(member_api, script=wait)
            wait_until(lambda: state_is(member_api, job["id"], "running"), what="running")
            gateway.send_signal(signal.SIGKILL)
            gateway.wait(10)
            release(directory)  # it finishes while no gateway listens
            assert job_shown(member_api, job["id"])["state"] == "running"  # L5: nothing assumed
            gateway, _ = start_gateway(tmp_path, console_pki, port, **settings)
            done = wait_until(
                lambda: state_is(member_api, job["id"], "succeeded"), 40, what="the exit"
            )
            (attempt,) = done["attempts"]
            assert attempt["members"][0]["exit_code"] == 0
            wait_until(lambda: not CardHold.objects.exists(), what="cleanup confirmed")
            start = NodeCommand.objects.get(kind="start")
            assert start.state == "succeeded" and start.cleaned_at is not None
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(20)
            gateway.send_signal(signal.SIGTERM)
            gateway.wait(20)


def test_R10_a_cancel_that_reaches_a_member_before_it_starts_ends_it_cancelled(
    require_redis, tmp_path, console_pki, node_fleet, mint, member_api
):
    node, env, _ = lay_out_a_joined_node(node_fleet, mint, tmp_path)
    with (
        worker(tmp_path, require_redis),
        running_gateway(tmp_path, console_pki, REDIS_URL=require_redis, **FAST) as target,
    ):
        agent = serve(env, target, tmp_path, inventory=H100_DEVICE_INVENTORY)
        try:
            wait_until(lambda: connected(node), what="the node connected")
            agent.send_signal(signal.SIGSTOP)  # the start waits, undelivered, on the stream
            try:
                job = submit(member_api, command=["sleep", "600"])
                wait_until(lambda: state_is(member_api, job["id"], "starting"), what="starting")
                response = member_api.post(f"/api/training-jobs/{job['id']}/cancel")
                assert response.status_code == 200 and response.json()["state"] == "starting"
            finally:
                agent.send_signal(signal.SIGCONT)
            # The frozen agent's stream may have ended meanwhile: it reconnects, then takes
            # the start and the stop in order (a loaded machine may take a while).
            done = wait_until(lambda: state_is(member_api, job["id"], "cancelled"), 60, what="done")
            assert done["attempts"][0]["state"] == "cancelled"
            wait_until(lambda: not CardHold.objects.exists(), what="cleanup confirmed")
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(20)


@pytest.fixture
def two_agents(require_redis, tmp_path, console_pki, node_fleet, mint):
    """Two nodes of one Fleet, each a real agent with a state dir of its own."""
    nodes = [lay_out_a_joined_node(node_fleet, mint, tmp_path, f"gpu-0{n}") for n in (1, 2)]
    with ExitStack() as stack:
        stack.enter_context(worker(tmp_path, require_redis))
        target = stack.enter_context(
            running_gateway(tmp_path, console_pki, REDIS_URL=require_redis, **FAST)
        )
        agents = []
        for n, (node, env, _) in enumerate(nodes):
            Node.objects.filter(pk=node.pk).update(address=f"127.0.0.{n + 1}:9100")
            devices = tmp_path / f"devices-{n}"
            devices.mkdir()
            agents.append(serve(env, target, devices, inventory=H100_DEVICE_INVENTORY))
        try:
            for node, _, _ in nodes:
                wait_until(lambda node=node: connected(node), what="both nodes connected")
            yield [node for node, _, _ in nodes], agents
        finally:
            for agent in agents:
                agent.send_signal(signal.SIGCONT)
                agent.send_signal(signal.SIGTERM)
                agent.wait(20)
            for node, _, _ in nodes:  # a start taken as its agent stopped runs on (R6)
                for member_id in agent_cgroups.cgroup_members(node.id):
                    agent_cgroups.signal_member(None, f"{node.id}/{member_id}", signal.SIGKILL)
                    agent_cgroups.release(f"{node.id}/{member_id}")


GANG = """
import json, os, socket, time
env = dict(os.environ)
if env["RANK"] == "0":
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", int(env["MASTER_PORT"])))
    server.listen(1)
    server.settimeout(40)
    peer, _ = server.accept()
    env["GOT"] = peer.recv(64).decode()
else:
    for _ in range(400):
        try:
            peer = socket.create_connection((env["MASTER_ADDR"], int(env["MASTER_PORT"])), 2)
            break
        except OSError:
            time.sleep(0.1)
    peer.sendall(b"hello from rank 1")
    peer.close()
print(json.dumps(env))
"""


def test_R3_R4_R19_a_gang_runs_on_two_real_agents_and_its_ranks_meet_at_the_master(
    two_agents, member_api
):
    """Rank 0 listens on MASTER_PORT in its own network namespace; rank 1, on the other
    agent, dials MASTER_ADDR:MASTER_PORT through the node's mapping (R19) and says hello."""
    job = submit(member_api, cards=8, nodes=2, command=["python3", "-c", GANG])
    try:
        done = wait_until(lambda: state_is(member_api, job["id"], "succeeded"), 60, what="success")
    except AssertionError:
        shown = job_shown(member_api, job["id"])
        ranks = [output_of(member_api, job["id"], rank) for rank in (0, 1)]
        raise AssertionError((shown["state"], shown["attempts"], ranks)) from None
    members = done["attempts"][0]["members"]
    assert {m["node"] for m in members} == {node.id for node in two_agents[0]}
    envs = [json.loads(output_of(member_api, job["id"], rank)) for rank in (0, 1)]
    master = Node.objects.get(pk=members[0]["node"]).address.split(":")[0]
    assert envs[0]["GOT"] == "hello from rank 1"
    for rank, env in enumerate(envs):
        assert (env["RANK"], env["NODE_RANK"], env["WORLD_SIZE"]) == (str(rank), str(rank), "16")
        assert env["LOCAL_WORLD_SIZE"] == "8"
        # The master's node address; a loopback one is where the mapping answers a member.
        assert env["MASTER_ADDR"] == master or master.startswith("127."), (env, master)
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]


def test_R3_a_gang_member_failing_fails_the_attempt_and_stops_the_other(two_agents, member_api):
    job = submit(
        member_api,
        cards=8,
        nodes=2,
        script='if [ "$RANK" = 1 ]; then sleep 1; exit 7; fi; sleep 600',
    )
    failed = wait_until(lambda: state_is(member_api, job["id"], "failed"), 40, what="failure")
    attempt = failed["attempts"][0]
    assert (attempt["state"], attempt["reason"]) == ("failed", "exit")
    ranks = {m["rank"]: m for m in attempt["members"]}
    assert (ranks[1]["exit_code"], ranks[1]["reason"]) == (7, "exit")
    wait_until(
        lambda: job_shown(member_api, job["id"])["attempts"][0]["members"][0]["reason"]
        == "stopped",
        what="rank 0 stopped",
    )
    wait_until(lambda: not CardHold.objects.exists(), what="both cleaned up")


def test_R3_a_gang_whose_second_member_never_starts_fails_its_deadline(two_agents, member_api):
    nodes, agents = two_agents
    agents[1].send_signal(signal.SIGSTOP)  # its start is never taken
    job = submit(member_api, cards=8, nodes=2, command=["sleep", "600"], gang_deadline_seconds=3)
    wait_until(
        lambda: Attempt.objects.filter(training_job_id=job["id"], state="starting").exists(),
        what="allocated",
    )
    wait_until(
        lambda: any(
            m["state"] == "running"
            for m in job_shown(member_api, job["id"])["attempts"][0]["members"]
        ),
        what="rank 0 running",
    )
    wait_until(lambda: members_reconcile()["gang_deadline"] or None, 20, what="the deadline missed")
    attempt = job_shown(member_api, job["id"])["attempts"][0]
    assert (attempt["state"], attempt["reason"]) == ("failed", "gang_deadline")
    assert job_shown(member_api, job["id"])["state"] == "queued"  # retried after a backoff
    running = next(m for m in attempt["members"] if m["node"] == nodes[0].id)
    wait_until(
        lambda: next(
            m
            for m in job_shown(member_api, job["id"])["attempts"][0]["members"]
            if m["rank"] == running["rank"]
        )["cleanup"]
        == "cleaned",
        what="the started member stopped and cleaned",
    )
