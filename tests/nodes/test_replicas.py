"""A deployment's replicas on the agent (DESIGN §7, S1): real HTTP servers as real processes,
restarted by the agent when they exit and probed for readiness, driven through the agent's
own command handling without a stream — through the stream and the console it is
tests/e2e/test_deployments.py."""

import json
import os
import signal
import socket
import time
import urllib.request

import pytest

from nodes.agent.member import cgroups, policy
from nodes.agent.member.probing import Prober, probe
from tests.conftest import H100_DEVICES

from .test_members import CARDS, node, start  # noqa: F401 -- node: a fixture

pytestmark = pytest.mark.e2e

# A trivial server: /health answers HEALTH_STATUS (200 unless the env says otherwise); every
# path answers its pid and the env a replica gets.
SERVER = """
import http.server, json, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        status = int(os.environ.get("HEALTH_STATUS", "200")) if self.path == "/health" else 200
        shown = ("PORT", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "MODEL")
        body = json.dumps({"pid": os.getpid(), "env": {k: os.environ.get(k) for k in shown}})
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body.encode())
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H)
print("serving on", os.environ["PORT"], flush=True)
server.serve_forever()
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve_payload(port: int, **env) -> dict:
    return {
        "argv": ["python3", "-c", SERVER],
        "env": env,
        "serve": {"port": port, "readiness_path": "/health"},
    }


def get(port: int, path: str = "/") -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return json.loads(response.read())


def until(what: str, check, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"not {what} within {timeout}s")


def member(node, member_id):  # noqa: F811 -- node: the fixture
    """The member after the agent has looked at what runs, as it does every second."""
    node.tick()
    return next(c for c in node.known() if c.command_id == member_id)


def answers(port: int, node=None):  # noqa: F811
    """What the server on the port answers, if it does; with ``node``, the agent first looks
    at its members, as its watcher does every second (a restart falls due there)."""
    if node is not None:
        node.tick()
    try:
        return get(port)
    except OSError:
        return None


def test_S1_a_replica_gets_its_port_and_cards_and_is_restarted_with_a_backoff_when_it_exits(
    node,  # noqa: F811
):
    port = free_port()
    start(node, "r-1", [CARDS[3]], **serve_payload(port, MODEL="a"))
    first = until("serving", lambda: answers(port))
    assert first["env"] == {
        "PORT": str(port),
        "CUDA_VISIBLE_DEVICES": "3",
        "NVIDIA_VISIBLE_DEVICES": H100_DEVICES[3]["uuid"],
        "MODEL": "a",
    }
    os.kill(first["pid"], signal.SIGKILL)
    restarting = until("restarting", lambda: (m := member(node, "r-1")).restart_at and m)
    assert (restarting.state, restarting.reason, restarting.ready) == (
        "running",
        "restarting",
        False,
    )
    assert restarting.detail == "exited with 137; restarting in 1s"
    second = until(
        "serving again", lambda: (a := answers(port, node)) and a["pid"] != first["pid"] and a
    )
    again = member(node, "r-1")
    assert (again.state, again.reason, again.restarts) == ("running", "", 1)
    assert again.cards == [CARDS[3]]  # its cards stay its own across restarts (R7)
    os.kill(second["pid"], signal.SIGKILL)
    # The second restart waits twice as long as the first: the backoff doubles.
    waiting = until("restarting again", lambda: (m := member(node, "r-1")).restart_at and m)
    assert "restarting in 2s" in waiting.detail
    until("serving a third time", lambda: answers(port, node) and member(node, "r-1").restarts == 2)
    assert member(node, "r-1").restarts == 2


def test_S1_a_stop_ends_a_replica_and_it_is_not_restarted(node):  # noqa: F811
    port = free_port()
    start(node, "r-stop", [CARDS[0]], **serve_payload(port))
    until("serving", lambda: answers(port))
    node.accept("stop-1", "stop", {"member": "r-stop", "grace_seconds": 5})
    ended = until("ended", lambda: (m := member(node, "r-stop")).state != "running" and m)
    assert (ended.state, ended.reason) == ("failed", "stopped")
    time.sleep(2)  # beyond the first restart's backoff
    assert answers(port, node) is None and member(node, "r-stop").restarts == 0


def test_S1_a_stop_during_the_restart_backoff_ends_it_there(node):  # noqa: F811
    port = free_port()
    start(node, "r-crash", [CARDS[0]], argv=["sh", "-c", "exit 3"], serve={"port": port})
    until("restarting", lambda: member(node, "r-crash").reason == "restarting")
    node.accept("stop-2", "stop", {"member": "r-crash", "grace_seconds": 1})
    ended = until("ended", lambda: (m := member(node, "r-crash")).state != "running" and m)
    assert (ended.state, ended.reason, ended.exit_code) == ("failed", "stopped", 3)


def test_S1_readiness_one_success_ready_three_failures_not_ready(node):  # noqa: F811
    port = free_port()
    start(node, "r-probe", [CARDS[0]], **serve_payload(port, HEALTH_STATUS="503"))
    until("serving", lambda: answers(port))
    prober = Prober(node.runner, interval=0.0, startup=0.0)
    prober.tick(time.monotonic())
    failing = until("probed", lambda: (m := member(node, "r-probe")).detail and m)
    assert (failing.ready, failing.detail) == (False, "HTTP 503 from /health")
    # Ready after one success; a ready replica stays ready through two failures, not three.
    node.runner.probed("r-probe", "", failures=0)
    assert member(node, "r-probe").ready is True
    node.runner.probed("r-probe", "connection refused on port 1", failures=1)
    assert (member(node, "r-probe").ready, member(node, "r-probe").detail) == (True, "")
    node.runner.probed("r-probe", "connection refused on port 1", failures=3)
    assert member(node, "r-probe").ready is False
    assert member(node, "r-probe").detail == "connection refused on port 1"


def test_S1_the_probe_says_why_in_stable_words():
    port = free_port()
    assert probe(port, "/health") == f"connection refused on port {port}"
    with socket.socket() as silent:  # accepts, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        assert probe(silent.getsockname()[1], "/", timeout=0.5) == ("probe timed out after 0s")


def test_S1_the_prober_counts_failures_in_a_row_before_a_ready_replica_goes_unready(
    node,  # noqa: F811
):
    port = free_port()
    start(node, "r-count", [CARDS[0]], **serve_payload(port))
    until("serving", lambda: answers(port))
    prober = Prober(node.runner, interval=0.0, startup=0.0)

    def probe_once():
        prober.tick(time.monotonic())
        until("probed", lambda: not prober.pending)

    probe_once()
    assert member(node, "r-count").ready is True
    os.kill(answers(port)["pid"], signal.SIGSTOP)  # alive, not answering: probes time out
    try:
        for _ in range(policy.FAILURES_TO_UNREADY - 1):
            probe_once()
            assert member(node, "r-count").ready is True
        probe_once()
        assert member(node, "r-count").ready is False
        assert "timed out" in member(node, "r-count").detail
    finally:
        for pid in members_pids(node, "r-count"):
            os.kill(pid, signal.SIGCONT)


def members_pids(node, member_id):  # noqa: F811
    return cgroups.cgroup_pids(node.cgroup(member_id))


def test_S1_a_replica_is_probed_every_second_until_first_ready_then_every_interval(
    node,  # noqa: F811
):
    port = free_port()
    start(node, "r-startup", [CARDS[0]], **serve_payload(port))
    until("serving", lambda: answers(port))
    prober = Prober(node.runner, interval=5.0, startup=1.0)
    now = time.monotonic()
    prober.tick(now)  # not Ready yet: the next probe a second on
    until("probed", lambda: not prober.pending)
    assert prober.due["r-startup"] == now + 1.0 and member(node, "r-startup").ready
    prober.tick(now + 1.0)  # Ready in this launch: the next one an interval on
    until("probed", lambda: not prober.pending)
    assert prober.due["r-startup"] == now + 6.0
