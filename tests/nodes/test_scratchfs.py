"""A member's scratch dir is a filesystem with a hard size (R21, nodes/agent/member/scratchfs.py):
its pure parts (sizes, argv, the mount table) anywhere, the rest as root on this machine with
real loop mounts, a member's uid writing until its filesystem says ENOSPC. Every mount and loop
device a test makes is removed after it, also when it fails."""

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from nodes.agent.member import scratchfs
from tests.missing_parts import skip_missing

UID, OTHER_UID = 61999, 61998
SIZE = 32 << 20
MiB = 1 << 20
PYTHON = "/usr/bin/python3"

# A member's writer: 64 KiB at a time until the filesystem refuses; it stops by itself at
# ``cap`` bytes, so that a scratch that is no filesystem of its own never fills the node.
# Prints the bytes written and the errno that stopped it (0: the cap did).
FLOOD = """
import os, sys
path, cap = sys.argv[1], int(sys.argv[2])
chunk = b"x" * (64 << 10)
written, code = 0, 0
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
try:
    while written < cap:
        written += os.write(fd, chunk)
    os.fsync(fd)
except OSError as error:
    code = error.errno
    os.fsync(fd)
print(written, code)
"""

# A member's process that keeps a file open in its scratch (and its cwd there) until its
# stdin closes.
HOLDER = """
import sys
held = open("held", "w")
held.write("still here")
held.flush()
print("ready", flush=True)
sys.stdin.read()
"""


# A member's process that fills 5 MiB of a file, removes its name and keeps it open.
HIDDEN = """
import os, sys
held = open("hidden", "wb")
held.write(b"x" * (5 << 20))
held.flush()
os.fsync(held.fileno())
os.unlink("hidden")
print("ready", flush=True)
sys.stdin.read()
"""


def as_member(uid: int, code: str, *args: str, cwd: Path, **options):
    """Python run as a member's uid (no groups, no environment of ours)."""
    return subprocess.Popen(
        [PYTHON, "-c", code, *args],
        cwd=cwd,
        user=uid,
        group=uid,
        extra_groups=[],
        env={"PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **options,
    )


def flood(scratch: Path, cap: int) -> tuple[int, int]:
    writer = as_member(UID, FLOOD, "flood", str(cap), cwd=scratch)
    out, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, err
    written, code = out.split()
    return int(written), int(code)


def mounts_under(base: Path) -> list[str]:
    points = [
        scratchfs.unescape(line.split(" ")[4])
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
    ]
    return [point for point in points if point.startswith(f"{base}/")]


def loops_under(base: Path) -> list[str]:
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            if backing.read_text().startswith(f"{base}/"):
                found.append(f"/dev/{backing.parent.parent.name}")
    return found


def mount_options(mountpoint: Path) -> set[str]:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        if scratchfs.unescape(fields[4]) == str(mountpoint):
            return set(fields[5].split(","))
    raise AssertionError(f"nothing mounted at {mountpoint}")


class Place:
    """Where a test's scratches go, as the agent lays them out: the mountpoints in a dir of
    root's that members may pass but not list or write (0711), the images in one of root's
    alone (0700), under /var/tmp (the tests' tmp_path is root's 0700: no member passes)."""

    def __init__(self):
        self.base = Path(tempfile.mkdtemp(prefix="tuneplane-scratchfs-", dir="/var/tmp"))
        os.chmod(self.base, 0o711)
        self.members = self.base / "members"
        self.members.mkdir(mode=0o711)
        os.chmod(self.members, 0o711)
        self.images = self.base / "images"
        self.images.mkdir(mode=0o700)
        self.processes: list[subprocess.Popen] = []

    def paths(self, member_id: str) -> tuple[Path, Path]:
        return self.members / member_id, self.images / f"{member_id}.img"

    def clear(self) -> None:
        """Whatever a test left, also when it failed half-way: its processes, mounts, loop
        devices and files."""
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.communicate()
        for _ in range(scratchfs.UNMOUNT_TRIES):
            for point in mounts_under(self.base):
                subprocess.run(["/usr/bin/umount", "--lazy", point], capture_output=True)
        for device in loops_under(self.base):
            subprocess.run(["/usr/sbin/losetup", "--detach", device], capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture
def place():
    if os.geteuid() != 0:
        skip_missing("a root shell (loop mounts need one)", "run the tests as root, as .ci/run")
    for tools, package in ((scratchfs.MKE2FS, "e2fsprogs"), (scratchfs.LOSETUP, "mount")):
        if not any(os.access(tool, os.X_OK) for tool in tools):
            skip_missing(os.path.basename(tools[0]), f"apt-get install {package}")
    made = Place()
    yield made
    made.clear()
    assert not mounts_under(made.base), "a test left a mount"
    assert not loops_under(made.base), "a test left a loop device"


real = pytest.mark.e2e  # real mounts and processes of a member's uid


# Pure parts ---------------------------------------------------------------------------------


def test_R21_an_image_is_whole_blocks_never_past_the_limit():
    assert scratchfs.image_size(50 * MiB) == 50 * MiB
    assert scratchfs.image_size(50 * MiB + 4095) == 50 * MiB
    assert scratchfs.image_size(50 * MiB + 4096) == 50 * MiB + 4096
    assert scratchfs.image_size(100 << 30) == 100 << 30


def test_R21_a_limit_below_the_smallest_ext4_gets_the_smallest():
    """mke2fs refuses an ext4 of 4 KiB blocks below 256 KiB; the floor is 1 MiB, and the
    confinement text says so."""
    assert scratchfs.image_size(1) == scratchfs.MIN_BYTES
    assert scratchfs.image_size(scratchfs.MIN_BYTES - 1) == scratchfs.MIN_BYTES
    assert scratchfs.image_size(scratchfs.MIN_BYTES) == scratchfs.MIN_BYTES
    assert scratchfs.describe(1000, scratchfs.image_size(1000)) == (
        "scratch 1 MiB ext4 (the smallest; 1000 bytes asked)"
    )
    for wrong in (0, -1):
        with pytest.raises(ValueError):
            scratchfs.image_size(wrong)


def test_R21_the_confinement_text_names_the_scratchs_size_and_kind():
    assert scratchfs.describe(50 * MiB, 50 * MiB) == "scratch 50 MiB ext4"
    assert scratchfs.describe(100 << 30, 100 << 30) == "scratch 100 GiB ext4"
    assert scratchfs.describe(3 * MiB // 2, 3 * MiB // 2) == "scratch 1.5 MiB ext4"
    assert scratchfs.describe(None) == "scratch: a plain dir, no limit"
    assert scratchfs.describe(0) == "scratch: a plain dir, no limit"
    assert "watched" in scratchfs.describe(50 * MiB)  # not root: no filesystem of its own


def test_R21_mke2fs_makes_a_fast_sparse_ext4_with_nothing_reserved():
    argv = scratchfs.mkfs_argv("/usr/sbin/mke2fs", Path("/s/images/m-1.img"), 50 * MiB)
    assert argv[0] == "/usr/sbin/mke2fs"
    assert argv[argv.index("-t") + 1] == "ext4"
    assert argv[argv.index("-m") + 1] == "0"  # no blocks only root may fill
    assert argv[argv.index("-b") + 1] == "4096"
    assert argv[argv.index("-O") + 1] == "^has_journal,^resize_inode"
    assert "lazy_itable_init=1" in argv[argv.index("-E") + 1]
    assert "-F" in argv and "-q" in argv
    assert argv[-2:] == ["/s/images/m-1.img", str(50 * MiB // 4096)]


def test_R21_R17_the_mount_is_a_loop_with_no_set_id_programs_and_no_devices():
    argv = scratchfs.mount_argv("/usr/bin/mount", Path("/s/images/m-1.img"), Path("/s/m/m-1"))
    assert argv[0] == "/usr/bin/mount"
    assert set(argv[argv.index("-o") + 1].split(",")) >= {"loop", "nosuid", "nodev"}
    assert argv[-2:] == ["/s/images/m-1.img", "/s/m/m-1"]
    assert scratchfs.unmount_argv("/usr/bin/umount", Path("/s/m/m-1"), lazy=True) == [
        "/usr/bin/umount",
        "--no-canonicalize",
        "--lazy",
        "/s/m/m-1",
    ]


def test_R21_the_mount_table_is_read_with_its_escapes_and_stacked_mounts():
    table = (
        "36 25 7:0 / /var/lib/tp/members/m\\0401 rw,nosuid,nodev shared:1 - ext4 /dev/loop0 rw\n"
        "37 36 7:1 / /var/lib/tp/members/m\\0401 rw,nosuid,nodev shared:1 - ext4 /dev/loop1 rw\n"
        "38 25 7:2 / /var/lib/tp/members/m rw - ext4 /dev/loop2 rw\n"
    )
    assert scratchfs.mounts_at(table, Path("/var/lib/tp/members/m 1")) == 2
    assert scratchfs.mounts_at(table, Path("/var/lib/tp/members/m")) == 1
    assert scratchfs.mounts_at(table, Path("/var/lib/tp/members/m-2")) == 0
    assert scratchfs.unescape("a\\011b\\012c\\134d") == "a\tb\nc\\d"


def test_R21_a_loop_device_is_the_images_also_once_the_image_is_unlinked():
    image = Path("/var/lib/tp/images/m-1.img")
    assert scratchfs.backs("/var/lib/tp/images/m-1.img\n", image)
    assert scratchfs.backs("/var/lib/tp/images/m-1.img (deleted)\n", image)
    assert not scratchfs.backs("/var/lib/tp/images/m-10.img\n", image)


def test_R17_the_tools_run_by_absolute_path_with_a_fixed_environment(monkeypatch):
    """A PATH, LD_PRELOAD or BASH_ENV in the agent's environment reaches none of the tools."""
    for name, value in (("PATH", "/var/tmp/.x:/usr/bin"), ("LD_PRELOAD", "/var/tmp/.x/e.so")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("BASH_ENV", "/var/tmp/.x/rc")
    ran = []

    def run(argv, **options):
        ran.append((argv, options))
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(scratchfs.subprocess, "run", run)
    scratchfs.run_tool(scratchfs.unmount_argv(scratchfs.tool(scratchfs.UMOUNT), Path("/s/m")), "u")
    ((argv, options),) = ran
    assert argv[0].startswith("/") and argv[0] in scratchfs.UMOUNT
    assert options["env"] == {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
    for tools in (scratchfs.MKE2FS, scratchfs.MOUNT, scratchfs.UMOUNT, scratchfs.LOSETUP):
        assert all(tool.startswith("/") for tool in tools)


def test_R17_scratch_is_made_only_in_a_dir_no_one_else_may_write(tmp_path):
    """A mountpoint's or image's parent that another user may write (where a member could
    plant a symlink for root's mount to follow) is refused, and nothing is made."""
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    for mountpoint, image in (
        (open_dir / "m-1", private / "m-1.img"),
        (private / "m-1", open_dir / "m-1.img"),
    ):
        try:
            with pytest.raises(OSError, match="R17"):
                scratchfs.make(mountpoint, image, SIZE, UID)
            assert not mountpoint.exists() and not image.exists()
        finally:
            scratchfs.remove(mountpoint, image)  # made all the same, when the check is broken


# As root, with real loop mounts ---------------------------------------------------------------


@real
def test_R21_a_member_filling_its_scratch_gets_ENOSPC_and_the_node_holds_at_most_its_size(place):
    mountpoint, image = place.paths("m-flood")
    assert scratchfs.make(mountpoint, image, SIZE, UID) == "scratch 32 MiB ext4"
    free_before = shutil.disk_usage(place.base).free
    written, code = flood(mountpoint, cap=2 * SIZE + MiB)
    assert code == errno.ENOSPC, f"no ENOSPC after {written} bytes"
    assert 0.95 * SIZE <= written <= SIZE  # nearly all its limit is its own, never more
    held = os.stat(image).st_blocks * 512
    assert written <= held <= SIZE  # what it wrote is in the image, and the image within size
    # The node's own free space (others share this disk: a margin for their writes).
    assert free_before - shutil.disk_usage(place.base).free <= SIZE + 16 * MiB
    assert scratchfs.used(mountpoint) >= written
    assert scratchfs.remove(mountpoint, image)


@real
def test_R21_R20_the_scratch_is_the_members_alone_and_holds_nothing_it_does_not_own(place):
    mountpoint, image = place.paths("m-own")
    scratchfs.make(mountpoint, image, SIZE, UID)
    info = os.stat(mountpoint)
    assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (UID, UID, 0o700)
    assert os.path.ismount(mountpoint)
    assert {"nosuid", "nodev"} <= mount_options(mountpoint)
    lister = "import os; print(sorted(os.listdir('.')))"
    owner = as_member(UID, lister, cwd=mountpoint)
    assert owner.communicate(timeout=30)[0].strip() == "[]"  # no lost+found of root's
    other = as_member(OTHER_UID, "import os; os.listdir(os.sys.argv[1])", str(mountpoint), cwd="/")
    _, err = other.communicate(timeout=30)
    assert other.returncode != 0 and "PermissionError" in err
    assert scratchfs.remove(mountpoint, image)


@real
def test_R21_remove_unmounts_and_deletes_everything_and_may_be_called_again(place):
    mountpoint, image = place.paths("m-gone")
    scratchfs.make(mountpoint, image, SIZE, UID)
    flood(mountpoint, cap=4 * MiB)
    assert scratchfs.attached(image)
    assert scratchfs.remove(mountpoint, image)
    assert not scratchfs.mounted(mountpoint)
    assert not os.path.lexists(image) and not os.path.lexists(mountpoint)
    assert scratchfs.attached(image) == []  # its loop device let go
    assert scratchfs.remove(mountpoint, image)


@real
def test_R21_remove_while_a_member_still_holds_a_file_unmounts_lazily(place):
    """A process that outlived its kill (or a runtime still tearing down) keeps a file open and
    its cwd in the scratch: it is unmounted all the same and its image removed; the detached
    filesystem and its loop device go once the last file closes."""
    mountpoint, image = place.paths("m-held")
    scratchfs.make(mountpoint, image, SIZE, UID)
    holder = as_member(UID, HOLDER, cwd=mountpoint, stdin=subprocess.PIPE)
    place.processes.append(holder)
    assert holder.stdout.readline().strip() == "ready"
    assert scratchfs.remove(mountpoint, image)
    assert not scratchfs.mounted(mountpoint)
    assert not os.path.lexists(image) and not os.path.lexists(mountpoint)
    assert holder.poll() is None  # still running, its file still open
    holder.communicate("", timeout=30)
    deadline = time.monotonic() + 10
    while scratchfs.attached(image) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scratchfs.attached(image) == []


@real
def test_R21_make_after_an_agent_restart_replaces_what_was_left(place):
    """An agent that died after mounting a member's scratch keeps nothing in memory: a new
    make() for the same member id finds the mount and image by their paths, removes them and
    makes the scratch fresh, mounted once."""
    mountpoint, image = place.paths("m-again")
    scratchfs.make(mountpoint, image, SIZE, UID)
    flood(mountpoint, cap=4 * MiB)
    assert scratchfs.make(mountpoint, image, 2 * SIZE, UID) == "scratch 64 MiB ext4"
    assert scratchfs.mounts_at(Path("/proc/self/mountinfo").read_text(), mountpoint) == 1
    assert os.listdir(mountpoint) == []
    assert os.statvfs(mountpoint).f_blocks * 4096 > SIZE  # the new size, a new filesystem
    assert len(scratchfs.attached(image)) == 1
    assert scratchfs.remove(mountpoint, image)


@real
def test_R21_a_lost_members_scratch_is_removed_by_its_paths_alone(place):
    """After a reboot, or a crash between attaching the image and mounting it: an image with
    a loop device and no mount, and a plain scratch dir where the member planted a link to a
    file of root's. remove() by the member's paths lets the device go, removes the link and
    never follows it."""
    mountpoint, image = place.paths("m-lost")
    scratchfs.make(mountpoint, image, SIZE, UID)
    subprocess.run(["/usr/bin/umount", str(mountpoint)], check=True)
    subprocess.run(["/usr/sbin/losetup", "--find", str(image)], check=True)
    precious = place.base / "precious"
    precious.write_text("root's")
    (mountpoint / "link").symlink_to(precious)
    (mountpoint / "dirlink").symlink_to(place.images, target_is_directory=True)
    assert scratchfs.attached(image)
    assert scratchfs.remove(mountpoint, image)
    assert scratchfs.attached(image) == []
    assert not os.path.lexists(image) and not os.path.lexists(mountpoint)
    assert precious.read_text() == "root's" and place.images.is_dir()


@real
def test_R21_remove_says_when_something_is_left_and_make_refuses_to_build_over_it(place):
    """An image that cannot be removed (immutable here; on a node, a filesystem gone read-only)
    is said, not hidden: remove() answers False, make() refuses; once it can go, it goes."""
    mountpoint, image = place.paths("m-stuck")
    scratchfs.make(mountpoint, image, SIZE, UID)
    subprocess.run(["/usr/bin/chattr", "+i", str(image)], check=True)
    try:
        assert scratchfs.remove(mountpoint, image) is False
        assert os.path.exists(image) and not scratchfs.mounted(mountpoint)
        with pytest.raises(OSError, match="could not be removed"):
            scratchfs.make(mountpoint, image, SIZE, UID)
    finally:
        subprocess.run(["/usr/bin/chattr", "-i", str(image)], check=True)
    assert scratchfs.remove(mountpoint, image)
    assert not os.path.lexists(image) and not os.path.lexists(mountpoint)


@real
def test_R21_a_member_with_no_limit_gets_a_plain_dir_of_its_own(place):
    mountpoint, image = place.paths("m-plain")
    assert scratchfs.make(mountpoint, image, None, UID) == "scratch: a plain dir, no limit"
    info = os.stat(mountpoint)
    assert (info.st_uid, info.st_mode & 0o7777) == (UID, 0o700)
    assert not os.path.ismount(mountpoint) and not os.path.lexists(image)
    flood(mountpoint, cap=2 * MiB)
    assert scratchfs.used(mountpoint) >= 2 * MiB  # the walk of a plain dir
    assert scratchfs.remove(mountpoint, image)
    assert not os.path.lexists(mountpoint)


@real
def test_R21_used_is_the_scratchs_own_filesystem_open_deleted_files_counted(place):
    """What the member's filesystem holds, read at once — also a file it removed and keeps
    open, which a walk of its tree never sees and which fills the scratch all the same."""
    mountpoint, image = place.paths("m-used")
    scratchfs.make(mountpoint, image, SIZE, UID)
    empty = scratchfs.used(mountpoint)
    holder = as_member(UID, HIDDEN, cwd=mountpoint, stdin=subprocess.PIPE)
    place.processes.append(holder)
    assert holder.stdout.readline().strip() == "ready"
    assert 5 * MiB <= scratchfs.used(mountpoint) - empty <= 5 * MiB + 64 * 1024
    holder.communicate("", timeout=30)
    assert scratchfs.remove(mountpoint, image)


@real
def test_R21_the_smallest_scratch_mounts_and_holds_at_most_its_size(place):
    mountpoint, image = place.paths("m-tiny")
    assert "the smallest" in scratchfs.make(mountpoint, image, 1000, UID)
    written, code = flood(mountpoint, cap=4 * MiB)
    assert code == errno.ENOSPC and written <= scratchfs.MIN_BYTES
    assert os.stat(image).st_size == scratchfs.MIN_BYTES
    assert scratchfs.remove(mountpoint, image)
