"""`make bench`: what a member's scratch of its own size costs (R21, scratchfs): make() and
remove() of a sparse ext4 image for 1 GiB and 100 GiB limits, a member's writer flooding its
scratch until ENOSPC (the filesystem is left at its size, the node holds no more than the
image), and reading how full a scratch of 10,000 files is: one statvfs against the du walk it
replaces. As root. Figures printed; only what R21 promises is asserted, never a time."""

import errno
import os
import statistics
import time

import pytest

from nodes.agent.member import logs, scratchfs
from tests.missing_parts import skip_missing
from tests.nodes.test_scratchfs import UID, Place, as_member, flood

pytestmark = pytest.mark.bench

ROUNDS = int(os.environ.get("TUNEPLANE_BENCH_SCRATCH_ROUNDS", "10"))
FLOOD_BYTES = int(os.environ.get("TUNEPLANE_BENCH_SCRATCH_FLOOD_MIB", "1024")) << 20
MiB, GiB = 1 << 20, 1 << 30

MANY_FILES = """
for n in range(10_000):
    with open(f"f{n}", "wb") as out:
        out.write(b"x" * 4096)
"""


@pytest.fixture
def place():
    if os.geteuid() != 0:
        skip_missing("a root shell (loop mounts need one)", "run the tests as root, as .ci/run")
    made = Place()
    yield made
    made.clear()


def figures(found: list[float]) -> str:
    ordered = sorted(found)
    p90 = ordered[max(0, int(len(ordered) * 0.9) - 1)]
    return f"p50 {statistics.median(found) * 1000:6.1f} ms, p90 {p90 * 1000:6.1f} ms"


def test_bench_R21_making_and_removing_a_scratch_of_its_own_size(place, capsys):
    lines = []
    for size in (GiB, 100 * GiB):
        made, removed, held = [], [], []
        for n in range(ROUNDS):
            mountpoint, image = place.paths(f"m-{size >> 30}g-{n}")
            began = time.perf_counter()
            scratchfs.make(mountpoint, image, size, UID)
            made.append(time.perf_counter() - began)
            held.append(os.stat(image).st_blocks * 512)
            began = time.perf_counter()
            assert scratchfs.remove(mountpoint, image)
            removed.append(time.perf_counter() - began)
        lines += [
            f"  {scratchfs.human(size):>8} make():   {figures(made)}",
            f"  {scratchfs.human(size):>8} remove(): {figures(removed)}",
            f"  {scratchfs.human(size):>8} on the node's disk once made: "
            f"{statistics.median(held) / 1024:.0f} KiB (sparse)",
        ]
    with capsys.disabled():
        print(f"\nscratch filesystems, {ROUNDS} rounds each:", *lines, sep="\n")


def test_bench_R21_a_flooded_scratch_is_left_at_its_size(place, capsys):
    mountpoint, image = place.paths("m-flood")
    description = scratchfs.make(mountpoint, image, FLOOD_BYTES, UID)
    began = time.perf_counter()
    written, code = flood(mountpoint, cap=2 * FLOOD_BYTES + MiB)
    took = time.perf_counter() - began
    used, held = scratchfs.used(mountpoint), os.stat(image).st_blocks * 512
    assert code == errno.ENOSPC and written <= FLOOD_BYTES and held <= FLOOD_BYTES
    assert scratchfs.remove(mountpoint, image)
    with capsys.disabled():
        print(
            f"\nscratch flood ({description}, 64 KiB writes, fsync at the end):\n"
            f"  ENOSPC after {written / MiB:.1f} MiB ({written / FLOOD_BYTES:.1%} of its size)"
            f" in {took:.2f} s, {written / MiB / took:.0f} MiB/s\n"
            f"  its filesystem holds {used / MiB:.1f} MiB; the node's disk holds "
            f"{held / MiB:.1f} MiB for it (the image's size: {FLOOD_BYTES / MiB:.0f} MiB)"
        )


def test_bench_R21_how_full_a_scratch_is_read_without_walking_it(place, capsys):
    mountpoint, image = place.paths("m-files")
    scratchfs.make(mountpoint, image, GiB, UID)
    writer = as_member(UID, MANY_FILES, cwd=mountpoint)
    assert writer.communicate(timeout=300)[0] == "" and writer.returncode == 0
    began = time.perf_counter()
    by_statvfs = scratchfs.used(mountpoint)
    statvfs_took = time.perf_counter() - began
    began = time.perf_counter()
    by_walk = logs.du(mountpoint)
    walk_took = time.perf_counter() - began
    assert scratchfs.remove(mountpoint, image)
    with capsys.disabled():
        print(
            "\nhow full a scratch of 10,000 files of 4 KiB is:\n"
            f"  used() (statvfs): {by_statvfs / MiB:.1f} MiB in {statvfs_took * 1e6:.0f} µs\n"
            f"  du walk:          {by_walk / MiB:.1f} MiB in {walk_took * 1000:.1f} ms"
        )
