"""What confining a member costs at its start (issue 37: at most 50 ms more at p50): the time
from the agent accepting a start to the member's own first command, for members run as the
agent's user and for members confined (a uid of their own, PID and mount namespaces, the
devices and pids cgroups), interleaved in one run on this machine. Printed, not asserted."""

import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from nodes.agent.executor import Executor
from nodes.agent.member import cgroups

pytestmark = pytest.mark.bench

ROUNDS = int(os.environ.get("TUNEPLANE_BENCH_ISOLATION_ROUNDS", "30"))


def started_after(executor: Executor, member_id: str) -> float:
    """Seconds from accepting the start to the member's first command having run."""
    began = time.perf_counter()
    executor.accept(
        member_id,
        "start",
        {"cards": [], "argv": ["sh", "-c", 'touch "$TUNEPLANE_SCRATCH_DIR/started"; sleep 30']},
    )
    marker = executor.scratch / member_id / "started"
    while not marker.exists():
        time.sleep(0.0005)
    took = time.perf_counter() - began
    executor.accept(f"c-{member_id}", "cleanup", {"member": member_id, "grace_seconds": 0})
    return took


def test_bench_a_confined_start_costs(capsys):
    root = Path(tempfile.mkdtemp(prefix="tuneplane-bench-isolation-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    scope = f"bench-{uuid.uuid4().hex[:8]}"
    plain = Executor(root / "plain", scope=scope + "-p")
    confined = Executor(root / "confined", scope=scope + "-c", uids=(62000, 62999))
    times = {"as the agent's user": [], "confined": []}
    try:
        for n in range(ROUNDS):
            times["as the agent's user"].append(started_after(plain, f"p-{n}"))
            times["confined"].append(started_after(confined, f"c-{n}"))
    finally:
        for executor in (plain, confined):
            for member_id in cgroups.cgroup_members(executor.scope):
                cgroups.kill_all(f"{executor.scope}/{member_id}")
                cgroups.release(f"{executor.scope}/{member_id}")
        shutil.rmtree(root, ignore_errors=True)
    with capsys.disabled():
        print(f"\nmember start, accept to its first command, {ROUNDS} each, interleaved:")
        for kind, found in times.items():
            ordered = sorted(found)
            p90 = ordered[int(len(ordered) * 0.9) - 1]
            print(
                f"  {kind:>20}: p50 {statistics.median(found) * 1000:6.1f} ms, "
                f"p90 {p90 * 1000:6.1f} ms"
            )
        cost = statistics.median(times["confined"]) - statistics.median(
            times["as the agent's user"]
        )
        print(f"  confinement costs {cost * 1000:.1f} ms at p50")
