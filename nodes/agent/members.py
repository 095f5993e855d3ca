"""A member: one process of a job's attempt on this node, holding the cards it was given.

What the console's ``start`` command asks for runs here (R4): its argv or script, with
``CUDA_VISIBLE_DEVICES`` (indices, PCI bus order) and ``NVIDIA_VISIBLE_DEVICES`` (UUIDs)
naming exactly its cards, the job's env, its Fleet's delivery and, in a gang, the rendezvous
env. It is confined to its CPU and memory in a cgroup named after it (R5), in a session of
its own so that nothing the agent does (a restart, an upgrade, a lost stream) takes it with
it (R6). Everything it leaves behind is named by its id — the cgroup, the scratch dir, the
log — so that ``cleanup`` finds it even when the state file is gone (R7).
"""

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

# "$1" is the exit file, "$2" the cgroup.procs files to join (space-separated); the argv
# follows. The wrapper joins the cgroups, then runs the argv in the foreground with a TERM
# trap: a stop's SIGTERM to the process group reaches the member, while the wrapper (whose
# trap runs only once the member is gone, and which the member does not inherit) stays to
# write the exit code, atomically, for an agent that may have restarted since.
WRAPPER = (
    'exitfile=$1; procs=$2; shift 2; for f in $procs; do echo $$ > "$f" || '
    '{ echo 125 > "$exitfile.tmp"; mv "$exitfile.tmp" "$exitfile"; exit 125; }; done; '
    'trap : TERM; "$@"; code=$?; echo "$code" > "$exitfile.tmp" && mv "$exitfile.tmp" "$exitfile"'
)
CONTROLLERS_V1 = ("memory", "cpu")
CPU_PERIOD_US = 100_000
# A process group still alive this long after SIGKILL is unkillable (stuck in the kernel).
UNKILLABLE_AFTER = 60.0
DEFAULT_GRACE = 30.0


def refusal(payload: dict, devices: list[dict], held: set[int], runtime: str = "") -> str:
    """R1: the console is authoritative — a start naming cards this node does not have, or
    that another live member holds, or an image where it has no container runtime, is
    refused; no card is ever substituted. "" if none."""
    cards = payload.get("cards")
    argv, script, image = payload.get("argv"), payload.get("script"), payload.get("image")
    if image is not None and not (isinstance(image, str) and image and image[0] != "-"):
        return "refused: image must be an image reference"
    if image and not runtime:
        return "refused: an image, and no container runtime on this node"
    if (
        not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv))
        and not (isinstance(script, str) and script)
        and not image
    ):
        return "refused: neither argv nor script nor image"
    if not isinstance(cards, list) or not all(
        isinstance(card, dict) and isinstance(card.get("index"), int) for card in cards
    ):
        return "refused: cards must be a list of {index, uuid}"
    have = {(device["index"], device["uuid"]) for device in devices}
    for card in cards:
        if (card["index"], card.get("uuid")) not in have:
            return f"refused: no card {card['index']} ({card.get('uuid')}) on this node"
    taken = sorted(held & {card["index"] for card in cards})
    return f"refused: card(s) {taken} held by another member" if taken else ""


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def cgroup_root() -> Path:
    return Path(os.environ.get("TUNEPLANE_NODE_CGROUP_ROOT", "/sys/fs/cgroup"))


def cgroup_paths(name: str) -> tuple[str, list[Path]]:
    """The cgroup version this node offers and a member's directories in it. ``name`` is
    ``<agent's scope>/<member id>``: two agents on one machine never see each other's."""
    root = cgroup_root()
    if (root / "cgroup.controllers").is_file():
        return "cgroup-v2", [root / "tuneplane" / name]
    if all((root / controller / "cgroup.procs").is_file() for controller in CONTROLLERS_V1):
        return "cgroup-v1", [root / c / "tuneplane" / name for c in CONTROLLERS_V1]
    return "", []


def cgroup_members(scope: str) -> list[str]:
    """The member ids that have a cgroup under an agent's scope: what it can rebuild a lost
    state file from."""
    _, paths = cgroup_paths(f"{scope}/-")
    parent = paths[0].parent if paths else None
    if parent is None or not parent.is_dir():
        return []
    return sorted(path.name for path in parent.iterdir() if path.is_dir())


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def confine(member_id: str, cpus: float | None, memory_bytes: int | None) -> tuple[str, list[str]]:
    """Make the member's cgroup with its limits. Returns the confinement it got (reported
    to the console) and the cgroup.procs files the wrapper joins."""
    version, paths = cgroup_paths(member_id)
    if not version:
        return "none: no cgroup v1 memory and cpu controllers or cgroup v2 here", []
    try:
        if version == "cgroup-v2":
            paths[0].mkdir(parents=True, exist_ok=True)
            level = cgroup_root()
            for part in paths[0].relative_to(cgroup_root()).parts[:-1]:
                _write(level / "cgroup.subtree_control", "+cpu +memory")
                level = level / part
            _write(level / "cgroup.subtree_control", "+cpu +memory")
            if memory_bytes:
                _write(paths[0] / "memory.max", str(memory_bytes))
                _write(paths[0] / "memory.swap.max", "0")
            if cpus:
                _write(paths[0] / "cpu.max", f"{int(cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}")
        else:
            memory, cpu = paths
            for path in paths:
                path.mkdir(parents=True, exist_ok=True)
            if memory_bytes:
                _write(memory / "memory.limit_in_bytes", str(memory_bytes))
                swap = memory / "memory.memsw.limit_in_bytes"
                if swap.exists():  # no swap beyond the limit: over it is an OOM, not a crawl
                    _write(swap, str(memory_bytes))
            if cpus:
                _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(cpu / "cpu.cfs_quota_us", str(int(cpus * CPU_PERIOD_US)))
    except OSError as error:
        release(member_id)
        return f"none: {error.strerror or error} ({error.filename})", []
    return version, [str(path / "cgroup.procs") for path in paths]


def oom_killed(member_id: str) -> bool:
    """Whether the kernel's OOM killer acted in the member's cgroup."""
    version, paths = cgroup_paths(member_id)
    name = "memory.events" if version == "cgroup-v2" else "memory.oom_control"
    try:
        lines = (paths[0] / name).read_text().splitlines()
    except (OSError, IndexError):
        return False
    counts = dict(line.split(maxsplit=1) for line in lines if " " in line)
    return int(counts.get("oom_kill", "0").strip() or 0) > 0


def cgroup_pids(member_id: str) -> list[int]:
    pids: set[int] = set()
    for path in cgroup_paths(member_id)[1]:
        try:
            pids.update(int(line) for line in (path / "cgroup.procs").read_text().split())
        except (OSError, ValueError):
            continue
    return sorted(pids)


def zombie(pid: int) -> bool:
    """Exited, not yet reaped by its parent (which may not be this agent): not running."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


def live_pids(name: str) -> list[int]:
    """The processes left in a member's cgroup that still run (a zombie does not)."""
    return [pid for pid in cgroup_pids(name) if not zombie(pid)]


def signal_member(pid: int | None, member_id: str, signum: int) -> None:
    """To its process group and to anything in its cgroup (a child that left the group)."""
    targets = [("group", pid)] if pid else []
    targets += [("pid", other) for other in cgroup_pids(member_id)]
    for kind, target in targets:
        try:
            if kind == "group":
                os.killpg(target, signum)
            else:
                os.kill(target, signum)
        except (ProcessLookupError, PermissionError):
            continue


def release(member_id: str) -> None:
    """Remove the member's cgroups (each empty by now; a busy one is left for the next try)."""
    for path in cgroup_paths(member_id)[1]:
        try:
            path.rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            time.sleep(0.1)  # the kernel frees a killed group's last task asynchronously
            try:
                path.rmdir()
            except OSError:
                continue
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # the agent's scope, once its last member is gone


def member_env(payload: dict, scratch: Path, storage_root: str | None = None) -> dict:
    """R4: exactly its cards, the job's env, its Fleet's delivery, a gang's rendezvous —
    over the agent's own environment, less what names cards or the agent's settings."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TUNEPLANE_", "CUDA_", "NVIDIA_"))
    }
    env.update(own_env(payload, scratch, storage_root))
    return env


def own_env(payload: dict, scratch: Path, storage_root: str | None = None) -> dict:
    """What the member's env says of it alone (all a container gets)."""
    cards = sorted(payload.get("cards") or [], key=lambda card: card["index"])
    env = dict(payload.get("env") or {})
    env.update(
        {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": ",".join(str(card["index"]) for card in cards),
            "NVIDIA_VISIBLE_DEVICES": ",".join(card["uuid"] for card in cards) or "void",
            "TUNEPLANE_SCRATCH_DIR": str(scratch),
        }
    )
    env.update({key: str(value) for key, value in (payload.get("labels") or {}).items()})
    delivery = payload.get("delivery") or {}
    shared = delivery.get("mode") == "shared-mount"
    for key, value in (delivery.get("env") or {}).items():
        env[key] = str(Path(storage_root or "/", value)) if shared else str(value)
    env.update({key: str(value) for key, value in (payload.get("rendezvous") or {}).items()})
    serve = payload.get("serve")
    if isinstance(serve, dict) and isinstance(serve.get("port"), int):
        env["PORT"] = str(serve["port"])  # a replica listens there (S1)
    return env


def argv_of(payload: dict, scratch: Path) -> list[str]:
    if payload.get("script"):
        script = scratch / "script.sh"
        script.write_text(payload["script"])
        return ["/bin/bash", str(script)]
    return list(payload.get("argv") or [])


def remove_scratch(scratch: Path) -> None:
    shutil.rmtree(scratch, ignore_errors=True)


def expired_logs(logs: Path, retention_seconds: float, keep: set[str]) -> list[Path]:
    """Log files of members no longer known, older than the retention."""
    if not logs.is_dir():
        return []
    cutoff = time.time() - retention_seconds
    return [
        path
        for path in logs.glob("*.log")
        if path.stem not in keep and path.stat().st_mtime < cutoff
    ]


def tail(path: Path, tail_bytes: int) -> bytes:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - tail_bytes))
            return handle.read()
    except OSError:
        return b""


SIGTERM, SIGKILL = signal.SIGTERM, signal.SIGKILL
