"""A member's scratch dir as a filesystem with a hard size (R21): a sparse ext4 image of its
own, loop-mounted ``nosuid,nodev`` at the scratch dir. A member that fills it gets ENOSPC from
its own filesystem; the node's filesystem holds at most the image's size for it. A member
with no scratch limit gets a plain dir.

Why an image and not a project quota: a project quota needs the node's filesystem made or
re-made with ext4's ``project`` and ``quota`` features and mounted ``prjquota`` (the root
filesystem here is mounted without it), which the agent cannot arrange on a machine it joins;
a loop device, ext4 and ``mount -o loop`` are on every Linux node.

The image is never mounted twice: whatever a previous life left at the same paths (a mount
kept over an agent restart, an image left by a reboot, an old plain dir) is removed and the
scratch made fresh, so the filesystem needs no journal and no check. Everything here is found
from the mount table, sysfs and the two paths named by the member's id — nothing is kept in
memory — so cleanup works after an agent restart and for a member whose record is lost.

Privileged steps (R17): the tools by absolute path with a fixed environment; the mountpoint
and image are made by root in root-owned dirs no one else may write (checked), so no member
can plant a symlink where root mounts, writes or removes.
"""

import contextlib
import errno
import logging
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

from .logs import du

logger = logging.getLogger(__name__)

BLOCK = 4096
# mke2fs refuses an ext4 of 4 KiB blocks below 256 KiB ("Not enough space to build proposed
# filesystem"); at 1 MiB it has 64 inodes and about 950 KiB a member can fill. A smaller limit
# is raised to this (and said so in the confinement text): the node is still bounded by 1 MiB.
MIN_BYTES = 1 << 20
# One inode per 16 KiB (ext4's default for filesystems past 512 MiB), also for small ones,
# where mke2fs would otherwise pick 1 KiB blocks and 128-byte inodes.
BYTES_PER_INODE = 16384

# The tools, by absolute path (R17): Debian's merged /usr first, then the old places.
MKE2FS = ("/usr/sbin/mke2fs", "/sbin/mke2fs")
MOUNT = ("/usr/bin/mount", "/bin/mount")
UMOUNT = ("/usr/bin/umount", "/bin/umount")
LOSETUP = ("/usr/sbin/losetup", "/sbin/losetup")
PACKAGE = {"mke2fs": "e2fsprogs", "mount": "mount", "umount": "mount", "losetup": "mount"}
# The whole environment they run with: nothing of the agent's or a member's.
TOOL_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
TOOL_TIMEOUT = 60.0
# An unmount is tried this many times (a plain one, then a lazy one if it is busy): the same
# path may hold stacked mounts, each unmount takes one.
UNMOUNT_TRIES = 8


# Pure parts -------------------------------------------------------------------------------


def image_size(size_bytes: int) -> int:
    """The image's size for a scratch limit: whole 4 KiB blocks, never past the limit, and
    no smaller than MIN_BYTES (the one case past the limit, by less than 1 MiB)."""
    if size_bytes <= 0:
        raise ValueError(f"a scratch limit is a positive number of bytes, not {size_bytes}")
    return max(MIN_BYTES, size_bytes // BLOCK * BLOCK)


def describe(size_bytes: int | None, made: int | None = None) -> str:
    """The confinement text's words for a scratch: its size and kind, and why it differs
    from the limit asked when it does."""
    if not size_bytes:
        return "scratch: a plain dir, no limit"
    if made is None:
        return f"scratch {human(size_bytes)} watched: a plain dir (the agent is not root)"
    text = f"scratch {human(made)} ext4"
    if made > size_bytes:
        text += f" (the smallest; {human(size_bytes)} asked)"
    return text


def human(size: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.4g} {unit}"
    return f"{size} bytes"


def mkfs_argv(mke2fs: str, image: Path, size: int) -> list[str]:
    """ext4 made for scratch that lives as long as its member: no journal (a crash's image is
    removed, never mounted again, so nothing needs replaying), no blocks reserved for root,
    no room kept for growing (it never grows). On a regular file mke2fs punches the whole
    image and marks the inode tables zeroed (a hole reads as zeros), so the kernel's lazy init
    writes nothing: the image stays sparse."""
    return [
        mke2fs,
        "-t",
        "ext4",
        "-q",
        "-F",
        "-b",
        str(BLOCK),
        "-I",
        "256",
        "-i",
        str(BYTES_PER_INODE),
        "-m",
        "0",
        "-O",
        "^has_journal,^resize_inode",
        "-E",
        "lazy_itable_init=1",
        str(image),
        str(size // BLOCK),
    ]


def mount_argv(mount: str, image: Path, mountpoint: Path) -> list[str]:
    """A loop mount (libmount finds a free loop device and sets it to detach itself once
    unmounted), with no set-id programs and no device files honoured."""
    options = "loop,nosuid,nodev,noatime"
    return [mount, "--no-canonicalize", "-t", "ext4", "-o", options, str(image), str(mountpoint)]


def unmount_argv(umount: str, mountpoint: Path, lazy: bool = False) -> list[str]:
    return [umount, "--no-canonicalize", *(["--lazy"] if lazy else []), str(mountpoint)]


def unescape(field: str) -> str:
    """A mount table path: the kernel writes space, tab, newline and backslash as octal."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field


def mounts_at(mountinfo: str, mountpoint: Path) -> int:
    """How many mounts ``/proc/self/mountinfo``'s text has at exactly this path."""
    target = str(mountpoint)
    return sum(
        1
        for line in mountinfo.splitlines()
        if len(line.split(" ")) > 4 and unescape(line.split(" ")[4]) == target
    )


def backs(backing_file: str, image: Path) -> bool:
    """Whether a loop device's ``backing_file`` (sysfs) is this image, unlinked or not."""
    name = backing_file.rstrip("\n")
    return name in (str(image), f"{image} (deleted)")


# The machine ------------------------------------------------------------------------------


def make(mountpoint: Path, image: Path, size_bytes: int | None, uid: int | None) -> str:
    """The member's scratch dir, fresh and empty, its root the member's (``uid``, 0700;
    root's when ``uid`` is None): an ext4 of ``image_size(size_bytes)`` mounted at
    ``mountpoint`` when there is a limit, else a plain dir. Whatever was left at these paths
    goes first. Returns the confinement text's words for it; OSError when it cannot be made
    (what was made of it is removed)."""
    mountpoint, image = _absolute(mountpoint), _absolute(image)
    _private_parent(mountpoint, "the scratch dir's parent")
    if size_bytes:
        size = image_size(size_bytes)
        _private_parent(image, "the scratch image's dir")
    if not remove(mountpoint, image):
        raise OSError(errno.EBUSY, f"what was left at {mountpoint} could not be removed")
    os.mkdir(mountpoint, 0o700)
    if not size_bytes:
        _hand_over(mountpoint, uid)
        return describe(None)
    if os.geteuid() != 0:
        _hand_over(mountpoint, uid)  # no mount without root: the agent's du watch holds it
        return describe(size_bytes)
    try:
        fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
        run_tool(mkfs_argv(tool(MKE2FS), image, size), "mke2fs")
        run_tool(mount_argv(tool(MOUNT), image, mountpoint), "mount")
        _hand_over(mountpoint, uid, mounted=True)
    except BaseException:
        remove(mountpoint, image)
        raise
    return describe(size_bytes, size)


def remove(mountpoint: Path, image: Path) -> bool:
    """Nothing left of a scratch: every mount at ``mountpoint`` unmounted (lazily when busy:
    an open file keeps the detached filesystem, and its loop device, until it is closed),
    the image's loop devices let go, the image and the dir removed. Safe to call again, after
    a restart, or when nothing was made. Whether nothing is left."""
    mountpoint, image = _absolute(mountpoint), _absolute(image)
    for _ in range(UNMOUNT_TRIES):
        if not mounted(mountpoint):
            break
        if run_tool(unmount_argv(tool(UMOUNT), mountpoint), "umount", check=False):
            run_tool(unmount_argv(tool(UMOUNT), mountpoint, lazy=True), "umount", check=False)
        if mounted(mountpoint):
            time.sleep(0.05)
    for device in attached(image):
        # A device still held (a lazily unmounted filesystem in use) is only set to let go
        # once its last user does, which mount's own loop devices are already.
        run_tool([tool(LOSETUP), "--detach", device], "losetup", check=False)
    try:
        os.unlink(image)
    except FileNotFoundError:
        pass
    except OSError as error:  # said below, with whatever else is left
        logger.warning("scratch image %s not removed: %s", image, error)
    if not mounted(mountpoint):
        _remove_dir(mountpoint)
    left = [
        what
        for what, there in (
            (f"a mount at {mountpoint}", mounted(mountpoint)),
            (f"the image {image}", os.path.lexists(image)),
            (f"the dir {mountpoint}", os.path.lexists(mountpoint)),
        )
        if there
    ]
    if left:
        logger.warning("scratch not removed: %s", ", ".join(left))
    held = attached(image)
    if held:
        logger.info("scratch %s unmounted; %s let go once its open files close", image, held)
    return not left


def used(mountpoint: Path) -> int:
    """Bytes a member's scratch holds: its own filesystem's count (one statvfs) when it has
    one, else a walk of the plain dir."""
    if os.path.ismount(mountpoint):
        fs = os.statvfs(mountpoint)
        return (fs.f_blocks - fs.f_bfree) * fs.f_frsize
    return du(Path(mountpoint))


def mounted(mountpoint: Path) -> bool:
    return mounts_at(Path("/proc/self/mountinfo").read_text(), _absolute(mountpoint)) > 0


def attached(image: Path) -> list[str]:
    """The loop devices whose backing file is this image (also once it is unlinked)."""
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            if backs(backing.read_text(), _absolute(image)):
                found.append(f"/dev/{backing.parent.parent.name}")
    return sorted(found)


def _absolute(path: Path) -> Path:
    """The path as the mount table writes it: its parent resolved (root's dirs), its own
    last part never followed."""
    path = Path(os.path.abspath(path))
    return Path(os.path.realpath(path.parent)) / path.name


def _private_parent(path: Path, what: str) -> None:
    """R17: root makes, mounts and removes here only inside a dir that is root's (the agent's
    own user's) and that no one else may write, so no member can put a symlink where root's
    path leads."""
    info = os.lstat(path.parent)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise OSError(
            errno.EPERM,
            f"{what} {path.parent} must be a dir of root's that no one else may write (R17)",
        )


def _hand_over(mountpoint: Path, uid: int | None, mounted: bool = False) -> None:
    """The scratch's root dir is the member's, 0700, and holds nothing it does not own (mke2fs
    leaves root's ``lost+found``). Done through a descriptor of the dir just made or mounted,
    never following a link."""
    fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        if mounted and os.fstat(fd).st_dev == os.lstat(mountpoint.parent).st_dev:
            raise OSError(errno.EIO, f"{mountpoint} is not the scratch's own filesystem")
        if mounted:
            with contextlib.suppress(FileNotFoundError):
                os.rmdir("lost+found", dir_fd=fd)
        if uid is not None:
            os.fchown(fd, uid, uid)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def _remove_dir(path: Path) -> None:
    """A plain scratch dir and all in it, or the empty dir under an unmounted one; links in
    it are removed, never followed (shutil.rmtree works by descriptors)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def tool(paths: tuple[str, ...]) -> str:
    found = next((path for path in paths if os.access(path, os.X_OK)), None)
    if found is None:
        name = os.path.basename(paths[0])
        raise OSError(errno.ENOENT, f"no {name} here (install {PACKAGE[name]}): tried {paths}")
    return found


def run_tool(argv: list[str], name: str, check: bool = True) -> int:
    """One tool run with nothing of anyone's environment; its exit code, or OSError naming
    what it said when ``check`` and it failed."""
    try:
        done = subprocess.run(
            argv,
            env=TOOL_ENV,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TOOL_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        raise OSError(errno.ETIMEDOUT, f"{name} took past {TOOL_TIMEOUT:.0f} s") from error
    said = (done.stderr or done.stdout).strip()
    if done.returncode and check:
        raise OSError(errno.EIO, f"{name} failed ({done.returncode}): {said[:300]}")
    if done.returncode:
        logger.info("%s exited %d: %s", name, done.returncode, said[:300])
    return done.returncode
