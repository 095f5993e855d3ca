"""The member runner (nodes/agent/member/runner.py) on real processes with no cgroups and no
root: the cgroup root is an empty folder, so confinement reads "none" and nothing needs
privileges. Time is passed to ``tick`` explicitly: a stop's grace, a replica's backoff and
an escalation are stepped through, not slept through. With cgroups and containers as root
it is test_members.py, test_replicas.py and test_containers.py."""

import contextlib
import json
import os
import signal
import time

import pytest

from nodes.agent.executor import Executor
from nodes.agent.member.record import Member

DEVICES = [{"index": i, "uuid": f"GPU-{i}"} for i in range(2)]


@pytest.fixture
def node(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEPLANE_NODE_CGROUP_ROOT", str(tmp_path / "no-cgroups"))
    commands = Executor(tmp_path / "state", devices=lambda: DEVICES, scope="test")
    yield commands
    for record in commands.known():
        if isinstance(record, Member) and record.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(record.pid, signal.SIGKILL)


def card(index):
    return {"index": index, "uuid": f"GPU-{index}"}


def record(node, member_id):
    return next(r for r in node.known() if r.command_id == member_id)


def until_exited(node, member_id, timeout=10.0):
    """Waits until the member's wrapper has written its exit file."""
    deadline = time.monotonic() + timeout
    while not node.store.path(member_id, ".exit").exists():
        assert time.monotonic() < deadline, f"{member_id} never exited"
        time.sleep(0.02)


def test_R4_a_start_is_recorded_before_it_runs_and_reading_changes_nothing_until_a_tick(node):
    started = node.accept("m-1", "start", {"cards": [card(0)], "argv": ["sh", "-c", "exit 0"]})
    assert started.state == "running" and started.confinement.startswith("none: ")
    until_exited(node, "m-1")
    # known() is a read: the process ended, and nothing says so until the agent looks.
    assert record(node, "m-1").state == "running"
    assert record(node, "m-1").state == "running"
    node.tick()
    assert (record(node, "m-1").state, record(node, "m-1").exit_code) == ("succeeded", 0)


def test_R10_a_stop_is_sigterm_then_sigkill_once_its_grace_has_passed_by_the_tick(node, tmp_path):
    ignores = ["sh", "-c", "trap '' TERM; while :; do sleep 0.05; done"]
    node.accept("m-2", "start", {"cards": [card(1)], "argv": ignores})
    time.sleep(0.2)  # its trap is set
    t0 = time.time()
    node.runner.stop(record(node, "m-2"), grace=30, now=t0)
    node.tick(now=t0 + 29)
    time.sleep(0.2)
    assert record(node, "m-2").state == "running"  # TERM ignored, the grace not over
    node.tick(now=t0 + 30)  # the grace is over: SIGKILL, to its wrapper too (no exit file)
    deadline = time.monotonic() + 10
    while record(node, "m-2").state == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
        node.tick(now=t0 + 31)
    assert (record(node, "m-2").state, record(node, "m-2").reason) == ("failed", "stopped")
    assert record(node, "m-2").killed_at == t0 + 30


def test_S1_a_replica_that_exits_waits_its_backoff_then_is_started_again(node):
    port = 1  # never listened on: the probe is not what this test is about
    payload = {"cards": [], "argv": ["sh", "-c", "exit 3"], "serve": {"port": port}}
    node.accept("r-1", "start", payload)
    until_exited(node, "r-1")
    t0 = time.time()
    node.tick(now=t0)
    waiting = record(node, "r-1")
    assert (waiting.state, waiting.reason, waiting.exit_code) == ("running", "restarting", 3)
    assert waiting.detail == "exited with 3; restarting in 1s" and waiting.restart_at == t0 + 1
    node.tick(now=t0 + 0.5)
    assert record(node, "r-1").restarts == 0  # not yet due
    node.tick(now=t0 + 1)
    again = record(node, "r-1")
    assert (again.restarts, again.reason, again.restart_at) == (1, "", None)
    assert again.launched_at == t0 + 1 and again.pid


def test_S1_a_probe_answer_from_before_a_restart_never_makes_the_new_launch_ready(node):
    node.accept("r-2", "start", {"cards": [], "argv": ["sleep", "30"], "serve": {"port": 1}})
    launched = record(node, "r-2").launched_at
    node.runner.probed("r-2", "", failures=0, launched_at=launched - 5)  # an older launch's
    assert record(node, "r-2").ready is False
    node.runner.probed("r-2", "", failures=0, launched_at=launched)
    assert record(node, "r-2").ready is True


def test_R6_a_record_an_older_agent_wrote_is_read_and_one_a_newer_wrote_too(node):
    node.store.directory.mkdir(parents=True, exist_ok=True)
    older = {"command_id": "m-old", "kind": "start", "argv": ["python3"], "state": "failed"}
    older.update(exit_code=1, reason="exit", cleaned=True, some_newer_field={"x": 1})
    (node.store.directory / "m-old.json").write_text(json.dumps(older))
    read = record(node, "m-old")
    assert isinstance(read, Member) and (read.state, read.cleaned) == ("failed", True)
    told = [(read.command_id, read.reported())]
    node.forget_finished(told)
    assert node.store.get("m-old") is None


def test_R16_a_members_log_is_cut_to_its_newest_part_past_its_limit(node):
    """The log of a member that writes without end never fills the node's disk: past its
    limit it keeps its newest half, and what the member writes next follows it."""
    writes = "yes a | head -c 300000; echo newest; sleep 1; echo after"
    node.accept("m-log", "start", {"cards": [], "argv": ["sh", "-c", writes], "log_bytes": 100_000})
    log = node.logs / "m-log.log"
    deadline = time.monotonic() + 10
    while b"newest" not in log.read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    node.tick()
    kept = log.read_bytes()
    assert len(kept) <= 50_000 and kept.endswith(b"a\na\nnewest\n"), len(kept)
    assert kept.startswith(b"[tuneplane-node: older output removed")
    until_exited(node, "m-log")
    node.tick()
    assert log.read_bytes().endswith(b"newest\nafter\n")  # appended after what was kept


def test_R16_a_member_whose_scratch_dir_grows_past_its_limit_is_stopped_scratch_full(node):
    node.runner.scratch_every = 0.0  # measured on every tick here (every 10 s on a node)
    fills = 'head -c 300000 /dev/urandom > "$TUNEPLANE_SCRATCH_DIR/big"; echo filled; sleep 30'
    node.accept(
        "m-full", "start", {"cards": [], "argv": ["sh", "-c", fills], "scratch_bytes": 100_000}
    )
    log = node.logs / "m-full.log"
    deadline = time.monotonic() + 10
    while b"filled" not in log.read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    node.tick()
    stopping = record(node, "m-full")
    assert stopping.stop_at is not None and stopping.limit_hit == "scratch_full"
    deadline = time.monotonic() + 10
    while record(node, "m-full").state == "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
        node.tick()
    ended = record(node, "m-full")
    assert (ended.state, ended.reason) == ("failed", "scratch_full")


def test_H4_a_members_checkpoint_mark_is_noted_at_the_agents_time_and_reported(node, tmp_path):
    """The member touches $TUNEPLANE_CHECKPOINT_MARK; the tick after notes it (at the time it
    is given, not the file's, which the member sets) and each change again; a link planted
    as the mark is none."""
    go = tmp_path / "go"
    marks = (
        f'while [ ! -e {go}1 ]; do sleep 0.02; done; touch -d @5 "$TUNEPLANE_CHECKPOINT_MARK"; '
        f'while [ ! -e {go}2 ]; do sleep 0.02; done; echo x >> "$TUNEPLANE_CHECKPOINT_MARK"; '
        f'while [ ! -e {go}3 ]; do sleep 0.02; done; rm "$TUNEPLANE_CHECKPOINT_MARK"; '
        'ln -s /etc/hostname "$TUNEPLANE_CHECKPOINT_MARK"; sleep 30'
    )
    node.accept("m-ck", "start", {"cards": [], "argv": ["sh", "-c", marks]})
    mark = node.scratch / "m-ck" / ".tuneplane-checkpoint"
    node.tick(now=1000.0)
    assert record(node, "m-ck").checkpoint_at is None  # none marked yet

    def after(step, check):
        (tmp_path / f"go{step}").touch()
        deadline = time.monotonic() + 10
        while not check():
            assert time.monotonic() < deadline, f"step {step}"
            time.sleep(0.02)

    after(1, mark.exists)
    node.tick(now=1010.0)
    assert record(node, "m-ck").checkpoint_at == 1010.0  # the agent's time, not the file's 5
    node.tick(now=1020.0)
    assert record(node, "m-ck").checkpoint_at == 1010.0  # unchanged: no new mark
    after(2, lambda: mark.stat().st_size > 0)
    node.tick(now=1030.0)
    assert record(node, "m-ck").checkpoint_at == 1030.0
    after(3, mark.is_symlink)
    node.tick(now=1040.0)
    assert record(node, "m-ck").checkpoint_at == 1030.0  # a link is no mark
    reported = node.store.get("m-ck").reported()
    assert 1030.0 in reported
