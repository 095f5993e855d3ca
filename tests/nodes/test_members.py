"""The agent's members (DESIGN §7, R1, R4–R7) on this machine: real processes in real
cgroups (v1 memory and cpu controllers here, as root), driven through the agent's own
command handling without a stream — what the stream delivers is tests/e2e/test_jobs.py."""

import json
import os
import time
from pathlib import Path

import pytest

from nodes.agent.command import process_start_time
from nodes.agent.executor import Executor
from nodes.agent.member import cgroups, launch
from nodes.agent.member.adoption import adopt_orphans
from tests.agent_members import CARDS, cleaned_up, looked_at, settled, start
from tests.conftest import H100_DEVICES

pytestmark = pytest.mark.e2e


def test_R4_a_member_gets_exactly_its_cards_env_labels_and_delivery(executor, tmp_path):
    out = tmp_path / "env.json"
    member = start(
        executor,
        "m-env",
        [CARDS[5], CARDS[2]],
        argv=["python3", "-c", f"import json,os; json.dump(dict(os.environ), open('{out}','w'))"],
        env={"LR": "1e-3"},
        labels={"TUNEPLANE_RANK": 0},
        delivery={"mode": "shared-mount", "env": {"TUNEPLANE_DATASET_X": "ml/datasets/x"}},
        rendezvous={"MASTER_ADDR": "10.0.0.1", "WORLD_SIZE": 16},
    )
    assert member.state == "running"
    assert settled(executor, "m-env").state == "succeeded"
    env = json.loads(out.read_text())
    assert env["CUDA_VISIBLE_DEVICES"] == "2,5"  # PCI bus order: by index
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{CARDS[2]['uuid']},{CARDS[5]['uuid']}"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert (env["LR"], env["TUNEPLANE_RANK"]) == ("1e-3", "0")
    assert env["TUNEPLANE_DATASET_X"] == "/srv/tp/ml/datasets/x"
    assert (env["MASTER_ADDR"], env["WORLD_SIZE"]) == ("10.0.0.1", "16")


def test_R1_a_start_naming_cards_the_node_lacks_or_another_member_holds_is_refused(executor):
    unknown = {"index": 9, "uuid": "GPU-not-here"}
    wrong_uuid = {"index": 1, "uuid": CARDS[2]["uuid"]}
    for member_id, cards in (("m-unknown", [unknown]), ("m-wrong", [wrong_uuid])):
        refused = start(executor, member_id, cards, argv=["true"])
        assert (refused.state, refused.reason) == ("failed", "refused")
    holder = start(executor, "m-holder", [CARDS[0]], argv=["sleep", "30"])
    assert holder.state == "running"
    taken = start(executor, "m-taken", [CARDS[0], CARDS[1]], argv=["true"])
    assert (taken.state, taken.reason) == ("failed", "refused")
    # Never substituted: card 1 was free, but the console named card 0 with it.
    executor.accept("c-clean", "cleanup", {"member": "m-holder", "grace_seconds": 0})
    assert settled(executor, "m-holder").cleaned


def test_a_replayed_start_changes_nothing_and_a_stop_for_an_unknown_member_is_answered(
    executor, tmp_path
):
    counter = tmp_path / "count"
    argv = ["sh", "-c", f"echo x >> {counter}; sleep 30"]
    first = start(executor, "m-once", [CARDS[3]], argv=argv)
    again = start(executor, "m-once", [CARDS[3]], argv=argv)
    assert (again.pid, again.state) == (first.pid, "running")
    time.sleep(0.5)
    assert counter.read_text() == "x\n"  # started once
    unknown = executor.accept("c-stop-unknown", "stop", {"member": "m-never"})
    assert (unknown.state, unknown.reason) == ("succeeded", "unknown_member")
    executor.accept("c-clean", "cleanup", {"member": "m-once", "grace_seconds": 0})
    assert settled(executor, "m-once").cleaned


def test_R10_stop_is_sigterm_then_sigkill_after_the_grace(executor, tmp_path):
    stubborn = ["sh", "-c", f"trap 'echo term >> {tmp_path}/log' TERM; while :; do sleep 0.1; done"]
    start(executor, "m-stubborn", [CARDS[0]], argv=stubborn)
    time.sleep(0.3)
    executor.accept("c-stop", "stop", {"member": "m-stubborn", "grace_seconds": 1})
    time.sleep(0.5)
    assert looked_at(executor, "m-stubborn").state == "running"
    ended = settled(executor, "m-stubborn")  # SIGKILL after the grace
    assert (ended.state, ended.reason) == ("failed", "stopped")
    assert (tmp_path / "log").read_text().startswith("term")


def test_R5_a_member_over_its_memory_ends_oom_and_reports_its_confinement(executor):
    member = start(
        executor,
        "m-hungry",
        [],
        argv=[
            "python3",
            "-c",
            "x = bytearray(400 * 1024 * 1024); x[::4096] = b'1' * len(x[::4096])",
        ],
        memory_bytes=64 << 20,
        cpus=0.5,
    )
    assert member.confinement == "cgroup-v1", member.confinement
    version, paths = cgroups.cgroup_paths(executor.cgroup("m-hungry"))
    assert (paths[0] / "memory.limit_in_bytes").read_text().strip() == str(64 << 20)
    assert (paths[1] / "cpu.cfs_quota_us").read_text().strip() == "50000"
    ended = settled(executor, "m-hungry")
    assert (ended.state, ended.reason) == ("failed", "oom")
    executor.accept("c-clean", "cleanup", {"member": "m-hungry"})
    assert settled(executor, "m-hungry").cleaned and not any(path.exists() for path in paths)


def test_R7_cleanup_kills_what_is_left_removes_the_scratch_and_keeps_the_log(executor, tmp_path):
    start(executor, "m-left", [CARDS[1]], script="echo hello; (sleep 60 &) ; sleep 60")
    scratch = executor.scratch / "m-left"
    assert (scratch / "script.sh").exists()
    time.sleep(0.5)
    executor.accept("c-clean", "cleanup", {"member": "m-left", "grace_seconds": 0})
    ended = cleaned_up(executor, "m-left")
    assert ended.cleaned and not scratch.exists()
    assert not cgroups.cgroup_pids(executor.cgroup("m-left"))  # the escaped grandchild too
    assert executor.log_read("m-left", 100).data.startswith(b"hello\n")
    # A cleanup of a member whose state file is lost still cleans by its id.
    stray = executor.accept("c-clean-lost", "cleanup", {"member": "m-lost-file"})
    assert stray.state == "succeeded"


def test_R6_after_a_reboot_a_member_is_node_rebooted_never_running(executor, tmp_path):
    start(executor, "m-before", [CARDS[0]], argv=["sleep", "0.1"])
    path = executor.directory / "m-before.json"
    saved = json.loads(path.read_text())
    saved.update(boot_id="an-earlier-boot", pid=999999, started="0")
    path.write_text(json.dumps(saved))
    Path(executor.directory / "m-before.exit").unlink(missing_ok=True)
    time.sleep(0.3)
    (executor.directory / "m-before.exit").unlink(missing_ok=True)
    ended = settled(executor, "m-before")
    assert (ended.state, ended.reason) == ("failed", "node_rebooted")


def test_R4_a_member_is_on_the_nodes_disk_before_its_process_starts(executor, monkeypatch):
    """At the moment the agent spawns a member's process its record is already on disk (an
    agent dying between the two leaves no process without a record); and the member, reading
    for its own record as its first act, finds it."""
    record = executor.directory / "m-first.json"
    on_disk_at_spawn = []
    spawn = launch.spawn

    def spawned(*args, **kwargs):
        on_disk_at_spawn.append(record.exists())
        return spawn(*args, **kwargs)

    monkeypatch.setattr(launch, "spawn", spawned)
    check = f"import os, sys; sys.exit(0 if os.path.exists({str(record)!r}) else 7)"
    start(executor, "m-first", [CARDS[0]], argv=["python3", "-c", check])
    assert on_disk_at_spawn == [True]
    ended = settled(executor, "m-first")
    assert (ended.state, ended.exit_code) == ("succeeded", 0)


def test_R6_a_reused_pid_never_reads_running_and_a_stop_never_signals_it(executor):
    """The member's process is gone and its pid now belongs to an unrelated process with
    another start time: the member is not running, and its stop leaves that process be."""
    import subprocess

    start(executor, "m-reused", [CARDS[0]], argv=["sleep", "600"])
    cgroups.signal_member(None, f"{executor.scope}/m-reused", cgroups.SIGKILL)
    time.sleep(0.1)  # ten clock ticks: the stranger's start time cannot be the member's
    stranger = subprocess.Popen(["sleep", "600"])
    try:
        path = executor.directory / "m-reused.json"
        saved = json.loads(path.read_text())
        assert saved["started"] != process_start_time(stranger.pid)
        saved.update(pid=stranger.pid)  # its start time stays the member's own
        path.write_text(json.dumps(saved))
        (executor.directory / "m-reused.exit").unlink(missing_ok=True)
        ended = settled(executor, "m-reused")
        assert ended.state == "failed" and ended.reason == "vanished"
        executor.accept("s-reused", "stop", {"member": "m-reused", "grace_seconds": 0})
        time.sleep(0.5)
        assert stranger.poll() is None, "the stop signalled an unrelated process (R6)"
    finally:
        stranger.kill()
        stranger.wait()


def test_logs_are_kept_for_the_retention_then_removed_by_the_agent(executor):
    start(executor, "m-kept", [CARDS[0]], argv=["echo", "kept"])
    settled(executor, "m-kept")
    executor.accept("c-clean", "cleanup", {"member": "m-kept"})
    told = [(record.command_id, record.reported()) for record in executor.known()]
    executor.forget_finished(told)  # reconciled by the console: forgotten
    log = executor.logs / "m-kept.log"
    assert log.read_text() == "kept\n"
    executor.expire_logs(retention_seconds=3600)
    assert log.exists()  # younger than the retention
    old = time.time() - 7200
    os.utime(log, (old, old))
    executor.expire_logs(retention_seconds=3600)
    assert not log.exists()


def test_R6_a_member_whose_state_file_is_lost_is_adopted_from_its_cgroup(executor, tmp_path):
    first = start(executor, "m-orphan", [CARDS[4]], argv=["sleep", "30"])
    deadline = time.monotonic() + 5
    while not cgroups.cgroup_pids(executor.cgroup("m-orphan")) and time.monotonic() < deadline:
        time.sleep(0.05)  # the wrapper joins its cgroup as it starts
    (executor.directory / "m-orphan.json").unlink()  # the state file lost
    again = Executor(executor.root, devices=lambda: H100_DEVICES, scope=executor.scope)
    assert adopt_orphans(again.runner) == ["m-orphan"]
    adopted = next(c for c in again.known() if c.command_id == "m-orphan")
    assert (adopted.state, adopted.pid, adopted.reason) == ("running", first.pid, "adopted")
    other = Executor(tmp_path / "other", devices=lambda: H100_DEVICES, scope="another-node")
    assert adopt_orphans(other.runner) == []  # another agent's scope: never its members
    again.accept("c-clean", "cleanup", {"member": "m-orphan", "grace_seconds": 0})
    assert settled(again, "m-orphan").cleaned
