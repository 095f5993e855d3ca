"""A confined member's OCI bundle (R18): the ``config.json`` and root the agent writes for the
runtime (``runc``, or ``crun``: both read the same bundle) — what the member is, decided here,
by pure functions; the runtime, maintained by people whose job it is, makes it so.

What a member gets: its own uid and gid and no other group; PID, IPC, UTS, mount, network and
cgroup namespaces; no capabilities; ``noNewPrivileges``; the default seccomp profile of
containers-common (what Podman applies), with what Docker's profile refuses a process without
``CAP_SYS_ADMIN`` refused too (new namespaces, ``mount``, ``keyctl``…); a root of its own whose
only host parts are read-only binds of ``/usr`` and ``/etc``; a fresh ``/proc`` with the
standard masked paths; a ``/dev`` holding only its own cards and the CUDA control devices;
private, sized ``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/dev/mqueue`` and ``/run``; cpus,
memory, pids and devices as its cgroup's resources. Its PID 1 is ``tini``, as Docker's
``--init``: a stop's SIGTERM reaches the member, whose own PID 1 would ignore it.
"""

import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path

from . import isolation

SECCOMP_PROFILE = Path("/usr/share/containers/seccomp.json")
INIT = "/usr/bin/tini"
CPU_PERIOD_US = 100_000
# Each private place is a tmpfs of this size unless the member's scratch limit is smaller.
TMP_BYTES = 1 << 30
SHM_BYTES = 1 << 30
RUN_BYTES = 16 << 20
NOFILE = 65536
# The host's top-level names a merged-/usr system links into /usr (Debian 12 does).
USR_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# runc's defaults (``runc spec``): what of /proc and /sys a member never reads or writes.
MASKED = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
]
READ_ONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
NAMESPACES = ("pid", "ipc", "uts", "mount", "network", "cgroup")
# What Docker's default profile allows only with CAP_SYS_ADMIN (or another capability a
# member never has) and containers-common's allows to all: refused here with EPERM.
REFUSED_SYSCALLS = (
    "unshare",
    "setns",
    "mount",
    "mount_setattr",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "umount",
    "umount2",
    "pivot_root",
    "keyctl",
    "add_key",
    "request_key",
    "name_to_handle_at",
    "quotactl",
    "quotactl_fd",
    "syslog",
)
# clone(2) with any namespace flag (CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET)
# is refused, as Docker does; clone3 answers ENOSYS so that the C library falls back to clone.
CLONE_NAMESPACES = 0x7E020000
EPERM, ENOSYS = 1, 38
# Docker's names for architectures, which containers-common's profile uses in its rules.
ARCH = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}
SCMP_ARCH = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}


@dataclass(frozen=True)
class Device:
    """A character device file in the member's ``/dev``."""

    path: str
    major: int
    minor: int


@dataclass(frozen=True)
class Bind:
    source: str
    destination: str
    read_only: bool = False


@dataclass(frozen=True)
class Sandbox:
    """Everything a member's bundle says of it."""

    uid: int
    argv: tuple[str, ...]
    env: dict
    cwd: str
    hostname: str
    cgroups_path: str
    cpus: float | None = None
    memory_bytes: int | None = None
    pids: int | None = None
    devices: tuple[Device, ...] = ()
    binds: tuple[Bind, ...] = ()
    # The network namespace it joins (a path the CNI plugins wired, R19); None: a new one
    # with only its loopback; "host": the node's own (a node with no member network).
    netns: str | None = None
    tmp_bytes: int = TMP_BYTES
    # Its open files' limit: NOFILE, or the agent's own hard limit where that is lower.
    nofile: int = NOFILE
    # Its root: the host's /usr and /etc bound read-only (a process member), or an image's
    # filesystem the agent mounted in the bundle (an image member, whose PID 1 is then the
    # static init bound into its /run).
    host_root: bool = True
    init: str = INIT


def card_devices(card_indices, majors: dict[str, int | None]) -> tuple[Device, ...]:
    """R12: exactly the member's cards (``/dev/nvidiaN`` is NVIDIA's 195:N) and, when it holds
    any, the control devices every CUDA process opens; a member without cards gets none."""
    cards = sorted(card_indices)
    if not cards:
        return ()
    found = [Device(f"/dev/nvidia{index}", isolation.NVIDIA_MAJOR, index) for index in cards]
    found += [Device("/dev/nvidiactl", isolation.NVIDIA_MAJOR, 255)]
    found += [Device("/dev/nvidia-modeset", isolation.NVIDIA_MAJOR, 254)]
    if majors.get("nvidia-uvm") is not None:
        found += [Device("/dev/nvidia-uvm", majors["nvidia-uvm"], 0)]
        found += [Device("/dev/nvidia-uvm-tools", majors["nvidia-uvm"], 1)]
    return tuple(found)


def config(sandbox: Sandbox, seccomp: dict | None) -> dict:
    """The bundle's ``config.json`` (OCI runtime spec 1.0)."""
    no_caps = {key: [] for key in ("bounding", "effective", "inheritable", "permitted", "ambient")}
    namespaces = [{"type": kind} for kind in NAMESPACES]
    if sandbox.netns == "host":
        namespaces = [ns for ns in namespaces if ns["type"] != "network"]
    elif sandbox.netns:
        namespaces = [
            {"type": "network", "path": sandbox.netns} if ns["type"] == "network" else ns
            for ns in namespaces
        ]
    spec = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": sandbox.uid, "gid": sandbox.uid, "additionalGids": []},
            "args": [sandbox.init, "--", *sandbox.argv],
            "env": [f"{key}={value}" for key, value in sandbox.env.items()],
            "cwd": sandbox.cwd,
            "capabilities": no_caps,
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": sandbox.nofile, "soft": sandbox.nofile}],
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": sandbox.hostname,
        "mounts": mounts(sandbox),
        "linux": {
            "namespaces": namespaces,
            "cgroupsPath": sandbox.cgroups_path,
            "resources": resources(sandbox),
            "devices": [
                {
                    "path": device.path,
                    "type": "c",
                    "major": device.major,
                    "minor": device.minor,
                    "fileMode": 0o666,
                    "uid": 0,
                    "gid": 0,
                }
                for device in sandbox.devices
            ],
            "maskedPaths": MASKED,
            "readonlyPaths": READ_ONLY,
        },
    }
    if seccomp is not None:
        spec["linux"]["seccomp"] = seccomp
    return spec


def _tmpfs(destination: str, size: int, *options: str) -> dict:
    return {
        "destination": destination,
        "type": "tmpfs",
        "source": "tmpfs",
        "options": ["nosuid", "nodev", *options, f"size={size}"],
    }


def mounts(sandbox: Sandbox) -> list[dict]:
    """Fresh kernel filesystems; the host's ``/usr`` and ``/etc`` read-only; every place it
    may write private to it and sized; its own binds (scratch, volumes, datasets) last, so
    that one under ``/tmp`` lands in its private ``/tmp``."""
    ro_bind = ["rbind", "ro", "nosuid", "nodev"]
    sized = min(sandbox.tmp_bytes, TMP_BYTES)
    found = [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": []},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        _tmpfs("/dev/shm", min(sandbox.tmp_bytes, SHM_BYTES), "noexec", "mode=1777"),
        {
            "destination": "/dev/mqueue",
            "type": "mqueue",
            "source": "mqueue",
            "options": ["nosuid", "noexec", "nodev"],
        },
    ]
    if sandbox.netns == "host":  # sysfs needs a network namespace of its own
        found.append({"destination": "/sys", "type": "bind", "source": "/sys", "options": ro_bind})
    else:
        found.append(
            {
                "destination": "/sys",
                "type": "sysfs",
                "source": "sysfs",
                "options": ["nosuid", "noexec", "nodev", "ro"],
            }
        )
    found.append(
        {
            "destination": "/sys/fs/cgroup",
            "type": "cgroup",
            "source": "cgroup",
            "options": ["nosuid", "noexec", "nodev", "relatime", "ro"],
        }
    )
    if sandbox.host_root:
        found += [
            {"destination": "/usr", "type": "bind", "source": "/usr", "options": ro_bind},
            {"destination": "/etc", "type": "bind", "source": "/etc", "options": ro_bind},
        ]
    found += [
        _tmpfs("/tmp", sized, "mode=1777"),
        _tmpfs("/var/tmp", sized, "mode=1777"),
        _tmpfs("/run", RUN_BYTES, "noexec", "mode=755"),
    ]
    for bind in sandbox.binds:
        options = ["rbind", "nosuid", "nodev", "ro" if bind.read_only else "rw"]
        found.append(
            {
                "destination": bind.destination,
                "type": "bind",
                "source": bind.source,
                "options": options,
            }
        )
    return found


def resources(sandbox: Sandbox) -> dict:
    """Its cgroup's limits (R12, R16): every device denied but its own (the runtime adds the
    basic ones: null, zero, full, random, urandom, tty, ptmx and the ptys)."""
    found: dict = {"devices": [{"allow": False, "access": "rwm"}]}
    found["devices"] += [
        {
            "allow": True,
            "type": "c",
            "major": device.major,
            "minor": device.minor,
            "access": "rwm",
        }
        for device in sandbox.devices
    ]
    if sandbox.memory_bytes:
        found["memory"] = {"limit": sandbox.memory_bytes, "swap": sandbox.memory_bytes}
    if sandbox.cpus:
        found["cpu"] = {"quota": int(sandbox.cpus * CPU_PERIOD_US), "period": CPU_PERIOD_US}
    if sandbox.pids:
        found["pids"] = {"limit": sandbox.pids}
    return found


def seccomp_of(profile: dict, machine: str | None = None) -> dict:
    """containers-common's profile (Docker's format: rules that name capabilities and
    architectures) as the OCI ``linux.seccomp`` for a process with no capabilities on this
    machine's architecture, as Podman filters it; then REFUSED_SYSCALLS refused and clone's
    namespace flags with them."""
    machine = machine or platform.machine()
    arch = ARCH.get(machine, machine)
    native = SCMP_ARCH.get(machine)
    architectures = []
    for entry in profile.get("archMap") or []:
        if entry.get("architecture") == native:
            architectures = [native, *entry.get("subArchitectures", [])]
    rules = []
    for rule in profile.get("syscalls") or []:
        includes, excludes = rule.get("includes") or {}, rule.get("excludes") or {}
        if includes.get("caps") or (includes.get("arches") and arch not in includes["arches"]):
            continue  # it needs a capability no member has, or is for another architecture
        if arch in (excludes.get("arches") or []):
            continue
        names = [
            name for name in rule["names"] if name not in REFUSED_SYSCALLS + ("clone", "clone3")
        ]
        if not names:
            continue
        kept = {"names": names, "action": rule["action"]}
        if rule.get("args"):
            kept["args"] = rule["args"]
        if rule.get("errnoRet") is not None:
            kept["errnoRet"] = rule["errnoRet"]
        rules.append(kept)
    rules += [
        {"names": list(REFUSED_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM},
        {
            "names": ["clone"],
            "action": "SCMP_ACT_ALLOW",
            "args": [
                {"index": 0, "value": CLONE_NAMESPACES, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}
            ],
        },
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS},
    ]
    seccomp = {"defaultAction": profile.get("defaultAction", "SCMP_ACT_ERRNO"), "syscalls": rules}
    if profile.get("defaultErrnoRet") is not None:
        seccomp["defaultErrnoRet"] = profile["defaultErrnoRet"]
    if architectures:
        seccomp["architectures"] = architectures
    return seccomp


def load_seccomp(path: Path = SECCOMP_PROFILE) -> dict | None:
    try:
        return seccomp_of(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError):
        return None


def write(bundle: Path, spec: dict, host_root: bool = True) -> None:
    """The bundle's dir (root's, 0700) with its ``config.json`` and, for a process member, an
    empty root: the dirs the mounts land on, and the merged-/usr links the host has (``bin →
    usr/bin``…). An image's root is the image's: nothing in it is made or followed here (a
    link in it is the tenant's), the runtime makes what its mounts need."""
    bundle.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(bundle, 0o700)
    if host_root:
        _host_root(bundle / "rootfs")
    written = bundle / "config.json.new"
    written.write_text(json.dumps(spec, indent=1))
    os.chmod(written, 0o600)
    os.replace(written, bundle / "config.json")


def _host_root(rootfs: Path) -> None:
    for name in ("usr", "etc", "proc", "sys", "dev", "tmp", "var/tmp", "run"):
        (rootfs / name).mkdir(parents=True, exist_ok=True)
    for name in ("tmp", "var/tmp"):  # the runtime gives a tmpfs its mount point's mode
        os.chmod(rootfs / name, 0o1777)
    os.chmod(rootfs, 0o755)
    for name in USR_LINKS:
        link, host = rootfs / name, Path("/") / name
        if host.is_symlink() and not link.is_symlink():
            link.symlink_to(os.readlink(host))
