"""A member's confinement as a process: its cgroup, named after it under the agent's scope
(R5), and the signals that reach everything in it (R7).

``name`` is ``<agent's scope>/<member id>`` throughout: two agents on one machine never see
each other's members. cgroup v2 where the node offers it, else v1's memory and cpu controllers.
"""

import contextlib
import os
import signal
import time
from pathlib import Path

SIGTERM, SIGKILL = signal.SIGTERM, signal.SIGKILL
CONTROLLERS_V1 = ("memory", "cpu")
V2_CONTROLLERS = ("cpu", "memory", "pids")
# Used where the node mounts them: a pids limit, the devices allowed (R12), and the freezer
# a cleanup freezes the member in before it kills it (R13).
OPTIONAL_V1 = ("pids", "devices", "freezer")
CPU_PERIOD_US = 100_000
FREEZE_WAIT = 2.0


def cgroup_root() -> Path:
    return Path(os.environ.get("TUNEPLANE_NODE_CGROUP_ROOT", "/sys/fs/cgroup"))


def cgroup_paths(name: str) -> tuple[str, list[Path]]:
    """The cgroup version this node offers and a member's directories in it. ``name`` is
    ``<agent's scope>/<member id>``: two agents on one machine never see each other's."""
    root = cgroup_root()
    if (root / "cgroup.controllers").is_file():
        return "cgroup-v2", [root / "tuneplane" / name]
    if all((root / controller / "cgroup.procs").is_file() for controller in CONTROLLERS_V1):
        present = [c for c in OPTIONAL_V1 if (root / c / "cgroup.procs").is_file()]
        return "cgroup-v1", [root / c / "tuneplane" / name for c in (*CONTROLLERS_V1, *present)]
    return "", []


def _enable_v2(member: Path) -> set[str]:
    """Hand cpu, memory and pids down from the root to the member's cgroup, as far as the
    node offers them (a hierarchy whose controllers v1 holds offers none); the ones its
    cgroup got."""
    offered = set(V2_CONTROLLERS)
    level = cgroup_root()
    for part in member.relative_to(cgroup_root()).parts:
        offered &= set((level / "cgroup.controllers").read_text().split())
        if offered:
            _write(level / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(offered)))
        level = level / part
    return offered


def _controller(paths: list[Path], name: str) -> Path | None:
    """A v1 member's directory under one controller, if the node mounts it."""
    return next((path for path in paths if path.parts[-4] == name), None)


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


def confine(
    member_id: str,
    cpus: float | None,
    memory_bytes: int | None,
    pids: int | None = None,
) -> tuple[str, list[str]]:
    """Make the member's cgroup with its limits: cpus, memory and the most processes it may
    have. Returns the confinement it got (reported to the console) and the cgroup.procs
    files the wrapper joins. A confined member's cgroup is the OCI runtime's instead."""
    version, paths = cgroup_paths(member_id)
    got = []
    if not version:
        return "none: no cgroup v1 memory and cpu controllers or cgroup v2 here", []
    try:
        if version == "cgroup-v2":
            member = paths[0]
            member.mkdir(parents=True, exist_ok=True)
            offered = _enable_v2(member)
            if memory_bytes:
                if "memory" in offered:
                    _write(member / "memory.max", str(memory_bytes))
                    _write(member / "memory.swap.max", "0")
                else:
                    got.append("no memory limit (no memory controller)")
            if cpus:
                if "cpu" in offered:
                    _write(member / "cpu.max", f"{int(cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}")
                else:
                    got.append("no cpu limit (no cpu controller)")
            if pids:
                if "pids" in offered:
                    _write(member / "pids.max", str(pids))
                    got.append(f"pids {pids}")
                else:
                    got.append("no pids limit (no pids controller)")
        else:
            memory, cpu = paths[:2]
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
            counted = _controller(paths, "pids")
            if pids:
                if counted is None:
                    got.append("no pids limit (no pids controller)")
                else:
                    _write(counted / "pids.max", str(pids))
                    got.append(f"pids {pids}")
    except OSError as error:
        release(member_id)
        return f"none: {error.strerror or error} ({error.filename})", []
    return "; ".join([version, *got]), [str(path / "cgroup.procs") for path in paths]


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


def signal_member(pid: int | None, member_id: str, signum: int) -> int:
    """To its process group and to anything in its cgroup (a child that left the group):
    how many of them it reached."""
    targets = [("group", pid)] if pid else []
    targets += [("pid", other) for other in cgroup_pids(member_id)]
    reached = 0
    for kind, target in targets:
        try:
            if kind == "group":
                os.killpg(target, signum)
            else:
                os.kill(target, signum)
        except (ProcessLookupError, PermissionError):
            continue
        reached += 1
    return reached


def kill_all(member_id: str) -> None:
    """R13: everything in the member's cgroup killed, a fork racing the kill included:
    ``cgroup.kill`` on v2; on v1 frozen first (the freezer), killed, then thawed so that
    the kills land."""
    version, paths = cgroup_paths(member_id)
    if version == "cgroup-v2" and (paths[0] / "cgroup.kill").exists():
        with contextlib.suppress(OSError):
            _write(paths[0] / "cgroup.kill", "1")
            return
    freezer = _controller(paths, "freezer") if version == "cgroup-v1" else None
    frozen = False
    if freezer is not None and freezer.is_dir():
        with contextlib.suppress(OSError):
            _write(freezer / "freezer.state", "FROZEN")
            deadline = time.monotonic() + FREEZE_WAIT
            while (freezer / "freezer.state").read_text().strip() != "FROZEN":
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            frozen = True
    signal_member(None, member_id, SIGKILL)
    if frozen:
        with contextlib.suppress(OSError):
            _write(freezer / "freezer.state", "THAWED")


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
