"""The wall between members on a node (R11–R13), on this machine as root with cgroup v1: two
members of two projects on one agent. Member B tries, from its own command, every way to
another member and to the node the review found: A's environment in /proc, the node's key,
the start payloads, A's log and scratch, a card it does not hold (fake /dev/nvidiaN made with
mknod), writing outside its scratch, leaving its cgroup, forking past its pids limit. Every
attempt fails, A's secret is in none of B's output, and cleanup leaves nothing running."""

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from nodes.agent import state
from nodes.agent.executor import Executor
from nodes.agent.member import cgroups, isolation
from tests.agent_members import cleaned_up, settled

pytestmark = pytest.mark.e2e

UIDS = (61000, 61099)
# Each test that starts members has a range of its own: they may run side by side, in
# different pytest-xdist workers, and a uid in use is never handed out again.
REUSE_UIDS = (61200, 61299)
V2_UIDS = (61400, 61499)
DEVICES = [{"index": i, "uuid": f"GPU-{i}"} for i in range(4)]
SECRET = "s3cr3t-of-project-a"


def output_of(executor, member_id: str) -> bytes:
    """What the member has written so far, as the console would read it (b"" before any)."""
    read = executor.log_read(member_id, 1 << 16)
    return read.data if read else b""


@pytest.fixture
def node(request):
    """An agent whose members run confined, its state dir where any uid may pass (as
    /var/lib is), with fake card device files and a node key as join writes it."""
    root = Path(tempfile.mkdtemp(prefix="tuneplane-isolation-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    devices = root / "dev"
    devices.mkdir(mode=0o755)
    for index in range(4):
        os.mknod(devices / f"nvidia{index}", 0o666 | stat.S_IFCHR, os.makedev(195, index))
        os.chmod(devices / f"nvidia{index}", 0o666)
    scope = f"test-{uuid.uuid4().hex[:8]}"
    directory = root / "state"
    state.ensure_private_dir(directory)
    state.write_private(directory / state.KEY, b"-----BEGIN PRIVATE KEY-----node")
    uids = getattr(request, "param", UIDS)
    executor = Executor(directory, devices=lambda: DEVICES, scope=scope, uids=uids)
    yield executor, directory, devices
    for member_id in cgroups.cgroup_members(scope):
        cgroups.kill_all(f"{scope}/{member_id}")
        cgroups.release(f"{scope}/{member_id}")
    shutil.rmtree(root, ignore_errors=True)


ATTEMPTS = """
attempt() {{
  name=$1; shift
  if "$@" >/dev/null 2>&1; then echo "$name: REACHED"; else echo "$name: denied"; fi
}}
why() {{ name=$1; shift; echo "$name: $("$@" 2>&1 >/dev/null)"; }}
attempt a-environ sh -c 'cat /proc/{a_pid}/environ'
attempt a-signal kill -0 {a_pid}
attempt agent-env sh -c 'env | grep AGENT_ONLY_SETTING'
attempt node-key cat {state}/node.key
attempt payloads sh -c 'cat {state}/commands/*.json'
attempt a-log cat {state}/logs/m-a.log
attempt a-scratch ls {state}/members/m-a
why other-card sh -c 'exec 3<>{dev}/nvidia0'
attempt write-outside sh -c 'echo planted > {state}/planted'
attempt leave-cgroup sh -c 'echo $$ > /sys/fs/cgroup/memory/cgroup.procs'
attempt leave-group sh -c 'echo $$ > /sys/fs/cgroup/pids/cgroup.procs'
why own-card sh -c 'exec 3<>{dev}/nvidia1'
attempt own-scratch sh -c 'echo mine > "$TUNEPLANE_SCRATCH_DIR/mine"'
echo "uid: $(id -u) processes seen: $(ls -d /proc/[0-9]* | wc -l)"
python3 -c '
import os, time
n = 0
for _ in range(60):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    n += 1
print("sleeping children:", n, flush=True)
'
"""


def member_pid(executor, member_id: str, uid: int) -> int:
    """The member's own process (the uid's), not the root wrapper around it."""
    for pid in cgroups.cgroup_pids(executor.cgroup(member_id)):
        if f"\nUid:\t{uid}\t" in Path(f"/proc/{pid}/status").read_text():
            return pid
    raise AssertionError(f"no process of uid {uid} in {member_id}'s cgroup")


def test_R11_R12_R13_a_member_reaches_nothing_of_another_member_or_of_the_node(node, monkeypatch):
    executor, directory, devices = node
    monkeypatch.setenv("AGENT_ONLY_SETTING", "the agent's environment")
    a = executor.accept(
        "m-a", "start", {"cards": [DEVICES[0]], "argv": ["sleep", "60"], "env": {"KEY": SECRET}}
    )
    assert a.state == "running" and a.uid == UIDS[0], a.confinement
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            a_pid = member_pid(executor, "m-a", a.uid)
            break
        except AssertionError:
            time.sleep(0.05)
    assert SECRET in Path(f"/proc/{a_pid}/environ").read_text()  # there to be read, by root
    script = ATTEMPTS.format(a_pid=a_pid, state=directory, dev=devices)
    b = executor.accept("m-b", "start", {"cards": [DEVICES[1]], "script": script, "pids": 40})
    assert b.uid == UIDS[0] + 1 and b.uid != a.uid  # R11: a uid of its own
    assert "uid 61001" in b.confinement and "pids 40" in b.confinement
    assert "devices: its cards only" in b.confinement
    ended = settled(executor, "m-b", timeout=30)
    output = output_of(executor, "m-b").decode()
    assert ended.exit_code == 0, output
    assert SECRET not in output
    for attempt in (
        "a-environ",
        "a-signal",
        "agent-env",
        "node-key",
        "payloads",
        "a-log",
        "a-scratch",
        "write-outside",
        "leave-cgroup",
        "leave-group",
    ):
        assert f"{attempt}: denied" in output, (attempt, output)
    assert "own-scratch: REACHED" in output, output
    # R12: another member's card is refused by the devices cgroup (EPERM); its own card is
    # allowed, and then finds no driver on this GPU-less machine (ENXIO).
    assert (
        "other-card:" in output
        and "Operation not permitted" in output.split("other-card:")[1].split("\n")[0]
    )
    assert "No such device or address" in output.split("own-card:")[1].split("\n")[0], output
    assert not (directory / "planted").exists()
    seen = int(output.split("processes seen: ")[1].split()[0])
    assert seen < 10, output  # R11: its own processes only, in a PID namespace of its own
    assert f"uid: {UIDS[0] + 1} " in output
    children = int(output.split("sleeping children: ")[1].split()[0])
    assert children < 40, output  # R12: forking stops at its pids limit
    for member_id in ("m-a", "m-b"):
        executor.accept(f"c-{member_id}", "cleanup", {"member": member_id, "grace_seconds": 0})
    for member_id in ("m-a", "m-b"):
        cleaned = cleaned_up(executor, member_id)
        assert cleaned.cleaned and not cgroups.live_pids(executor.cgroup(member_id))
    assert not {UIDS[0], UIDS[0] + 1} & isolation.uids_running()  # R13: nothing left


@pytest.mark.parametrize("node", [REUSE_UIDS], indirect=True)
def test_R11_a_uid_is_never_reused_while_a_process_of_it_runs(node):
    executor, _, _ = node
    first = REUSE_UIDS[0]
    stray = subprocess.Popen(
        ["setpriv", f"--reuid={first}", f"--regid={first}", "--clear-groups", "sleep", "30"]
    )
    try:
        time.sleep(0.2)
        member = executor.accept("m-c", "start", {"cards": [], "argv": ["sleep", "30"]})
        assert member.uid == first + 1  # the range's first is still running something
    finally:
        stray.kill()
        stray.wait()
    executor.accept("c-c", "cleanup", {"member": "m-c", "grace_seconds": 0})
    settled(executor, "m-c")


@pytest.fixture
def cgroup_v2(monkeypatch):
    """The node's cgroup v2 hierarchy: /sys/fs/cgroup on a v2 machine, else mounted beside
    v1 (this machine's controllers are v1's, so it offers none of them: what it proves is
    the device program, the cgroup a member cannot leave and its kill)."""
    system = Path("/sys/fs/cgroup")
    mounted = None
    if (system / "cgroup.controllers").is_file():
        root = system
    else:
        mounted = root = Path(tempfile.mkdtemp(prefix="tuneplane-cgroup2-"))
        subprocess.run(["mount", "-t", "cgroup2", "none", str(root)], check=True)
    monkeypatch.setenv("TUNEPLANE_NODE_CGROUP_ROOT", str(root))
    yield root
    if mounted is not None:
        with contextlib.suppress(OSError):
            (root / "tuneplane").rmdir()
        subprocess.run(["umount", str(root)], check=True)
        root.rmdir()


V2_ATTEMPTS = """
why() {{ name=$1; shift; echo "$name: $("$@" 2>&1 >/dev/null)"; }}
why other-card sh -c 'exec 3<>{dev}/nvidia0'
why own-card sh -c 'exec 3<>{dev}/nvidia1'
why leave-cgroup sh -c 'echo $$ > {root}/cgroup.procs'
why make-device mknod {dev}/../made c 195 0
sleep 60
"""


@pytest.mark.parametrize("node", [V2_UIDS], indirect=True)
def test_R12_R13_on_cgroup_v2_an_ebpf_program_allows_only_its_cards(node, cgroup_v2):
    executor, directory, devices = node
    script = V2_ATTEMPTS.format(dev=devices, root=cgroup_v2)
    b = executor.accept("m-b", "start", {"cards": [DEVICES[1]], "script": script})
    assert b.state == "running" and b.confinement.startswith("cgroup-v2"), b.confinement
    assert "devices: its cards only" in b.confinement, b.confinement
    cgroup = cgroup_v2 / "tuneplane" / executor.cgroup("m-b")
    assert cgroup.is_dir()
    until = time.monotonic() + 10
    while "make-device:" not in output_of(executor, "m-b").decode():
        assert time.monotonic() < until, output_of(executor, "m-b")
        time.sleep(0.05)
    output = output_of(executor, "m-b").decode()

    def said(name):
        return output.split(f"{name}:")[1].split("\n")[0]

    # Another member's card is refused by the device program (EPERM); its own is allowed,
    # and finds no driver on this GPU-less machine (ENXIO).
    assert "Operation not permitted" in said("other-card"), output
    assert "No such device or address" in said("own-card"), output
    assert said("leave-cgroup").strip(), output  # refused: the cgroup's files are root's
    assert not (devices.parent / "made").exists()
    # R13: the cleanup kills the whole cgroup (cgroup.kill) and confirms it empty.
    executor.accept("c-b", "cleanup", {"member": "m-b", "grace_seconds": 0})
    cleaned = cleaned_up(executor, "m-b")
    assert cleaned.cleaned and not cgroup.exists()
    assert b.uid not in isolation.uids_running()
