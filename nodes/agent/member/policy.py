"""The member's decisions, as pure functions of what the runner observed (no process, file
or clock of their own): whether a start is refused, how a member ended, when a stop
escalates, when a replica restarts, and what a readiness probe's answer changes."""

import os
import stat
from dataclasses import dataclass

from ..wire import MemberSpec
from .shim import START_FAILED

# The code a member gets when its process is gone and left no exit code behind.
VANISHED = -1
# A process group still alive this long after SIGKILL is unkillable (stuck in the kernel).
UNKILLABLE_AFTER = 60.0
RESTART_FIRST = 1.0
RESTART_MAX = 60.0
# A process that ran this long before it exited starts its backoff afresh.
RESTART_RESET_AFTER = 300.0
FAILURES_TO_UNREADY = 3
MAX_DETAIL = 200
SIGTERM_EXIT = 128 + 15


def refusal(spec: MemberSpec, devices: list[dict], held: set[int], runtime: str = "") -> str:
    """R1: the console is authoritative — a start naming cards this node does not have, or
    that another live member holds, or an image where it has no container runtime, is
    refused; no card is ever substituted. "" if none."""
    if spec.image and not runtime:
        return "refused: an image, and no container runtime on this node"
    have = {(device["index"], device["uuid"]) for device in devices}
    for card in spec.cards:
        if (card.index, card.uuid) not in have:
            return f"refused: no card {card.index} ({card.uuid}) on this node"
    taken = sorted(held & spec.card_indices)
    return f"refused: card(s) {taken} held by another member" if taken else ""


@dataclass(frozen=True)
class Observed:
    """What the runner saw of a running member: its exit file's code (None: no file yet),
    whether the OOM killer ended it (asked only once it has exited), whether the process
    group it started still leads, its container's state (None: no container, or not asked
    while the group leads), whether a stop is under way, and the boot it started in against
    this one."""

    exit_code: int | None = None
    oom: bool = False
    leader_alive: bool = False
    container: dict | None = None
    stopping: bool = False
    boot_then: str = ""
    boot_now: str = ""


def ended(seen: Observed) -> tuple[int, str] | None:
    """How a member ended — (exit code, reason) — or None while it runs."""
    stopped = "stopped" if seen.stopping else "exit"
    container = seen.container
    if seen.exit_code == START_FAILED and seen.stopping:
        # Stopped while its runtime was still starting it (the SIGTERM reached the runtime's
        # init): it ends as that stop ends any member.
        return SIGTERM_EXIT, "stopped"
    if seen.exit_code is not None:
        return seen.exit_code, "oom" if seen.oom else stopped
    if seen.leader_alive or (container and container["running"]):
        return None
    if container is not None and seen.boot_then == seen.boot_now:
        # Its wrapper gone (an adopted container, say): the container says how it ended.
        return container["exit_code"], "oom" if container["oom_killed"] else stopped
    if seen.stopping:
        return -9, "stopped"  # killed with its wrapper by the SIGKILL
    if seen.boot_then and seen.boot_then != seen.boot_now:
        return VANISHED, "node_rebooted"  # R6: never running after a reboot
    return VANISHED, "vanished"


def final_state(code: int, reason: str) -> str:
    return "succeeded" if code == 0 and reason == "exit" else "failed"


def escalation(
    stop_at: float | None, grace: float, killed_at: float | None, reason: str, now: float
) -> str:
    """A stop under way: "kill" once its grace is over, "unkillable" a minute after the
    SIGKILL if it still runs, "" while it has time (or no stop is under way)."""
    if stop_at is None:
        return ""
    if killed_at is None:
        return "kill" if now >= stop_at + grace else ""
    if now >= killed_at + UNKILLABLE_AFTER and reason != "unkillable":
        return "unkillable"
    return ""


def unkillable(killed_at: float, now: float) -> bool:
    """Something of a member outlived its SIGKILL this long: stuck in the kernel (DESIGN §7)."""
    return now >= killed_at + UNKILLABLE_AFTER


def restart_delay(restarts: int) -> float:
    """Seconds before restart number ``restarts + 1``: 1 s, doubling, at most a minute."""
    return min(RESTART_MAX, RESTART_FIRST * 2 ** min(restarts, 16))


@dataclass(frozen=True)
class Restart:
    at: float
    backoff: int
    detail: str


def restart_after_exit(
    *,
    serving: bool,
    stopping: bool,
    launched_at: float | None,
    backoff: int,
    code: int,
    reason: str,
    now: float,
) -> Restart | None:
    """A replica's process ended: unless it is being stopped, when it starts again and why
    (its ``detail``). A job's member is never restarted here; None."""
    if not serving or stopping:
        return None
    if launched_at and now - launched_at >= RESTART_RESET_AFTER:
        backoff = 0
    why = "out of memory" if reason == "oom" else f"exited with {code}"
    if reason in ("vanished", "node_rebooted"):
        why = "node rebooted" if reason == "node_rebooted" else "process vanished"
    delay = restart_delay(backoff)
    return Restart(now + delay, backoff + 1, f"{why}; restarting in {delay:.0f}s"[:MAX_DETAIL])


def probed(ready: bool, detail: str, error: str, failures: int) -> tuple[bool, str]:
    """A probe's answer applied to a running replica: its readiness and detail after. One
    success makes it ready; once ready, only FAILURES_TO_UNREADY failures in a row make it
    not ready. Before its first success it is not ready, and says why."""
    if not error:
        return True, ""
    if failures >= FAILURES_TO_UNREADY or not ready:
        return False, error[:MAX_DETAIL]
    return ready, detail


def mark_seen(path) -> list | None:
    """What the member's checkpoint mark is now — (mtime_ns, size, inode) of a regular file,
    never through a link — or None when there is none."""
    try:
        found = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(found.st_mode):
        return None
    return [found.st_mtime_ns, found.st_size, found.st_ino]


def checkpoint_marked(before: list | None, now: list | None) -> bool:
    """H4: a checkpoint was marked since the last look — the mark appeared or changed."""
    return now is not None and now != before
