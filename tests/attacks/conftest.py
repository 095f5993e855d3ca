"""The attack suite's node: a real agent's runner as root, its members confined (R17–R21),
two projects' members on it. Project A's member holds a secret in its env and its scratch
dir; project B's member is the attacker, whose whole output is read back."""

import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from nodes.agent import state
from nodes.agent.executor import Executor
from nodes.agent.member import cgroups, sandbox
from tests.agent_members import cleaned_up, settled

DEVICES = [{"index": i, "uuid": f"GPU-{i}"} for i in range(4)]
SECRET = "s3cr3t-of-project-a"
KEY = b"-----BEGIN PRIVATE KEY-----node"


class Node:
    """An agent's executor, its state dir, and the attacks' ways in."""

    def __init__(self, executor: Executor, directory: Path, uids: tuple[int, int]):
        self.executor, self.directory, self.uids = executor, directory, uids

    def start(self, member_id: str, **payload):
        payload.setdefault("cards", [])
        member = self.executor.accept(member_id, "start", payload)
        assert member.state == "running", (member.reason, member.detail)
        return member

    def victim(self, member_id: str = "m-a", **payload):
        """Project A's member: its secret in its env and in a 0600 file of its scratch dir,
        running until cleaned up."""
        script = 'umask 077; echo "$KEY" > "$TUNEPLANE_SCRATCH_DIR/secret"; exec sleep 300'
        member = self.start(
            member_id, cards=[DEVICES[0]], script=script, env={"KEY": SECRET}, **payload
        )
        deadline = time.monotonic() + 10
        scratch = self.executor.scratch / member_id / "secret"
        while not scratch.exists():
            assert time.monotonic() < deadline, self.output(member_id)
            time.sleep(0.05)
        return member

    def attack(self, script: str, member_id: str = "m-b", timeout: float = 60, **payload):
        """Project B's member runs ``script`` to its end: what it printed, and how it ended."""
        payload.setdefault("cards", [DEVICES[1]])
        self.start(member_id, script=script, **payload)
        ended = settled(self.executor, member_id, timeout=timeout)
        return self.output(member_id), ended

    def output(self, member_id: str) -> str:
        read = self.executor.log_read(member_id, 1 << 20)
        return read.data.decode(errors="replace") if read else ""

    def clean(self, member_id: str):
        self.executor.accept(f"c-{member_id}", "cleanup", {"member": member_id, "grace_seconds": 0})
        return cleaned_up(self.executor, member_id, timeout=20)

    def host_pid(self, member_id: str, uid: int) -> int:
        """The member's own process as the node sees it."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for pid in cgroups.cgroup_pids(self.executor.cgroup(member_id)):
                status = Path(f"/proc/{pid}/status").read_text()
                if f"\nUid:\t{uid}\t" in status and status.startswith("Name:\tsleep\n"):
                    return pid
            time.sleep(0.05)
        raise AssertionError(f"no sleep of uid {uid} in {member_id}'s cgroup")


_ranges = iter(range(0, 10_000))


def uid_range() -> tuple[int, int]:
    """A range of 10 uids no other test of this run uses, by xdist worker: tests run side by
    side, and a uid in use is never handed out again."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    first = 63000 + worker * 400 + next(_ranges) % 40 * 10
    return first, first + 9


@pytest.fixture
def node(request):
    """A root agent whose members run confined, under the runtime (R18)."""
    yield from _node(request)


@pytest.fixture
def image_node(request, dockerd):
    """The same agent on a node with a container runtime: a member naming an image runs from
    it, under the same OCI runtime (R18)."""
    yield from _node(request, runtime=lambda: "docker")


def _node(request, runtime=lambda: ""):
    if os.geteuid() != 0 or sandbox.unavailable():
        pytest.fail(f"the attack suite runs as root with the runtime: {sandbox.unavailable()}")
    root = Path(tempfile.mkdtemp(prefix="tuneplane-attack-", dir="/var/tmp"))
    scope = f"attack-{uuid.uuid4().hex[:8]}"
    directory = root / "state"
    state.ensure_private_dir(directory)
    state.write_private(directory / state.KEY, KEY)
    uids = getattr(request, "param", None) or uid_range()
    executor = Executor(directory, devices=lambda: DEVICES, scope=scope, uids=uids, runtime=runtime)
    yield Node(executor, directory, uids)
    for member in executor.runner.store.members():
        if not member.cleaned:
            cleanup = {"member": member.command_id, "grace_seconds": 0}
            executor.accept(f"c-{member.command_id}", "cleanup", cleanup)
            cleaned_up(executor, member.command_id, timeout=20)
    for member_id in cgroups.cgroup_members(scope):
        cgroups.kill_all(f"{scope}/{member_id}")
        cgroups.release(f"{scope}/{member_id}")
    shutil.rmtree(root, ignore_errors=True)
