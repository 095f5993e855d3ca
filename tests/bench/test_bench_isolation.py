"""What confining a member costs (issue 46): at its start (at most 150 ms more at p50), the time
from the agent accepting a start to the member's own first command, for members run as the
agent's user and for members under the OCI runtime (R18: a bundle, runc, its own network wired
by the CNI plugins, R19), interleaved in one run on this machine; and a log flood of 1 GiB
against a 1 MiB cap (R21: at most cap + 64 KiB on disk, measured all along). Printed, not
asserted."""

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
from tests.agent_members import cleaned_up, looked_at

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
    cleaned_up(executor, member_id, timeout=30)  # its network and scratch go with it
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


def test_bench_a_log_flood_of_a_gib_stays_at_its_cap(capsys):
    root = Path(tempfile.mkdtemp(prefix="tuneplane-bench-flood-", dir="/var/tmp"))
    scope = f"bench-{uuid.uuid4().hex[:8]}"
    confined = Executor(root / "state", scope=scope, uids=(62900, 62999))
    cap = 1 << 20
    flood = "head -c 1073741824 /dev/zero | tr '\\0' x; echo; echo done"
    began = time.perf_counter()
    confined.accept("flood", "start", {"cards": [], "script": flood, "log_bytes": cap})
    log = root / "state" / "logs" / "flood.log"
    largest = samples = 0
    try:
        while looked_at(confined, "flood").state == "running":
            if log.exists():
                largest, samples = max(largest, log.stat().st_size), samples + 1
            time.sleep(0.001)
        took = time.perf_counter() - began
        largest = max(largest, log.stat().st_size)
    finally:
        confined.accept("c-flood", "cleanup", {"member": "flood", "grace_seconds": 0})
        cleaned_up(confined, "flood", timeout=30)
        shutil.rmtree(root, ignore_errors=True)
    with capsys.disabled():
        print(
            f"\nlog flood: 1 GiB written in {took:.1f} s against a {cap >> 10} KiB cap: the log "
            f"was at most {largest} bytes on disk ({largest - cap:+d} past the cap; "
            f"{samples} samples)"
        )
