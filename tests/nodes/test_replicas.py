"""A deployment's replicas on the agent (DESIGN §7, S1): real HTTP servers as real processes,
restarted by the agent when they exit and probed for readiness, driven through the agent's
own command handling without a stream — through the stream and the console it is
tests/e2e/test_deployments.py."""

import os
import signal
import socket
import time

import pytest

from nodes.agent.member import cgroups, policy
from nodes.agent.member.probing import Prober, probe
from tests.agent_members import CARDS, free_port, get, serve_payload, start, until
from tests.conftest import H100_DEVICES

pytestmark = pytest.mark.e2e


def member(executor, member_id):
    """The member after the agent has looked at what runs, as it does every second."""
    executor.tick()
    return next(c for c in executor.known() if c.command_id == member_id)


def answers(port: int, executor=None):
    """What the server on the port answers, if it does; with ``executor``, the agent first looks
    at its members, as its watcher does every second (a restart falls due there)."""
    if executor is not None:
        executor.tick()
    try:
        return get(port)
    except OSError:
        return None


def test_S1_a_replica_gets_its_port_and_cards_and_is_restarted_with_a_backoff_when_it_exits(
    executor,
):
    port = free_port()
    start(executor, "r-1", [CARDS[3]], **serve_payload(port, MODEL="a"))
    first = until("serving", lambda: answers(port))
    assert first["env"] == {
        "PORT": str(port),
        "CUDA_VISIBLE_DEVICES": "3",
        "NVIDIA_VISIBLE_DEVICES": H100_DEVICES[3]["uuid"],
        "MODEL": "a",
    }
    os.kill(first["pid"], signal.SIGKILL)
    restarting = until("restarting", lambda: (m := member(executor, "r-1")).restart_at and m)
    assert (restarting.state, restarting.reason, restarting.ready) == (
        "running",
        "restarting",
        False,
    )
    assert restarting.detail == "exited with 137; restarting in 1s"
    second = until(
        "serving again", lambda: (a := answers(port, executor)) and a["pid"] != first["pid"] and a
    )
    again = member(executor, "r-1")
    assert (again.state, again.reason, again.restarts) == ("running", "", 1)
    assert again.cards == [CARDS[3]]  # its cards stay its own across restarts (R7)
    os.kill(second["pid"], signal.SIGKILL)
    # The second restart waits twice as long as the first: the backoff doubles.
    waiting = until("restarting again", lambda: (m := member(executor, "r-1")).restart_at and m)
    assert "restarting in 2s" in waiting.detail
    until(
        "serving a third time",
        lambda: answers(port, executor) and member(executor, "r-1").restarts == 2,
    )
    assert member(executor, "r-1").restarts == 2


def test_S1_a_stop_ends_a_replica_and_it_is_not_restarted(executor):
    port = free_port()
    start(executor, "r-stop", [CARDS[0]], **serve_payload(port))
    until("serving", lambda: answers(port))
    executor.accept("stop-1", "stop", {"member": "r-stop", "grace_seconds": 5})
    ended = until("ended", lambda: (m := member(executor, "r-stop")).state != "running" and m)
    assert (ended.state, ended.reason) == ("failed", "stopped")
    time.sleep(2)  # beyond the first restart's backoff
    assert answers(port, executor) is None and member(executor, "r-stop").restarts == 0


def test_S1_a_stop_during_the_restart_backoff_ends_it_there(executor):
    port = free_port()
    start(executor, "r-crash", [CARDS[0]], argv=["sh", "-c", "exit 3"], serve={"port": port})
    until("restarting", lambda: member(executor, "r-crash").reason == "restarting")
    executor.accept("stop-2", "stop", {"member": "r-crash", "grace_seconds": 1})
    ended = until("ended", lambda: (m := member(executor, "r-crash")).state != "running" and m)
    assert (ended.state, ended.reason, ended.exit_code) == ("failed", "stopped", 3)


def test_S1_readiness_one_success_ready_three_failures_not_ready(executor):
    port = free_port()
    start(executor, "r-probe", [CARDS[0]], **serve_payload(port, HEALTH_STATUS="503"))
    until("serving", lambda: answers(port))
    prober = Prober(executor.runner, interval=0.0, startup=0.0)
    prober.tick(time.monotonic())
    failing = until("probed", lambda: (m := member(executor, "r-probe")).detail and m)
    assert (failing.ready, failing.detail) == (False, "HTTP 503 from /health")
    # Ready after one success; a ready replica stays ready through two failures, not three.
    executor.runner.probed("r-probe", "", failures=0)
    assert member(executor, "r-probe").ready is True
    executor.runner.probed("r-probe", "connection refused on port 1", failures=1)
    assert (member(executor, "r-probe").ready, member(executor, "r-probe").detail) == (True, "")
    executor.runner.probed("r-probe", "connection refused on port 1", failures=3)
    assert member(executor, "r-probe").ready is False
    assert member(executor, "r-probe").detail == "connection refused on port 1"


def test_S1_the_probe_says_why_in_stable_words():
    port = free_port()
    assert probe(port, "/health") == f"connection refused on port {port}"
    with socket.socket() as silent:  # accepts, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        assert probe(silent.getsockname()[1], "/", timeout=0.5) == ("probe timed out after 0s")


def test_S1_the_prober_counts_failures_in_a_row_before_a_ready_replica_goes_unready(
    executor,
):
    port = free_port()
    start(executor, "r-count", [CARDS[0]], **serve_payload(port))
    until("serving", lambda: answers(port))
    prober = Prober(executor.runner, interval=0.0, startup=0.0)

    def probe_once():
        prober.tick(time.monotonic())
        until("probed", lambda: not prober.pending)

    probe_once()
    assert member(executor, "r-count").ready is True
    os.kill(answers(port)["pid"], signal.SIGSTOP)  # alive, not answering: probes time out
    try:
        for _ in range(policy.FAILURES_TO_UNREADY - 1):
            probe_once()
            assert member(executor, "r-count").ready is True
        probe_once()
        assert member(executor, "r-count").ready is False
        assert "timed out" in member(executor, "r-count").detail
    finally:
        for pid in members_pids(executor, "r-count"):
            os.kill(pid, signal.SIGCONT)


def members_pids(executor, member_id):
    return cgroups.cgroup_pids(executor.cgroup(member_id))


def test_S1_a_replica_is_probed_every_second_until_first_ready_then_every_interval(
    executor,
):
    port = free_port()
    start(executor, "r-startup", [CARDS[0]], **serve_payload(port))
    until("serving", lambda: answers(port))
    prober = Prober(executor.runner, interval=5.0, startup=1.0)
    now = time.monotonic()
    prober.tick(now)  # not Ready yet: the next probe a second on
    until("probed", lambda: not prober.pending)
    assert prober.due["r-startup"] == now + 1.0 and member(executor, "r-startup").ready
    prober.tick(now + 1.0)  # Ready in this launch: the next one an interval on
    until("probed", lambda: not prober.pending)
    assert prober.due["r-startup"] == now + 6.0
