"""A command as the agent keeps it in its state dir (commands.py): its kind, its process and,
for a member, what it holds and how it ends."""

import re
from dataclasses import dataclass, field
from pathlib import Path

from . import members

RUNNING, SUCCEEDED, FAILED = "running", "succeeded", "failed"
START, STOP, CLEANUP = "start", "stop", "cleanup"
# The code a command gets when its process is gone and left no exit code behind.
VANISHED = -1
# "$0" is the exit file; the command's argv follows. The code is written atomically.
WRAPPER = '"$@"; code=$?; echo "$code" > "$0.tmp" && mv "$0.tmp" "$0"'
# A command id names files in the state dir: nothing that could climb out of it.
COMMAND_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}")


@dataclass
class Command:
    command_id: str
    kind: str
    argv: list
    state: str = RUNNING
    exit_code: int | None = None
    pid: int | None = None
    started: str | None = None  # the process's start time in /proc, against pid reuse
    # A member's (kind start): why it ended, whether what it left is gone, its confinement,
    # the boot it started in, its cards, and a stop under way (grace, when asked, when killed).
    reason: str = ""
    cleaned: bool = False
    confinement: str = ""
    boot_id: str = ""
    cards: list = field(default_factory=list)
    stop_at: float | None = None
    grace: float = members.DEFAULT_GRACE
    killed_at: float | None = None
    cleanup_wanted: bool = False
    # The runtime a member in a container runs under ("docker", "podman"); "": a process.
    container: str = ""
    # A replica's (replicas.py): its port and readiness path, the start it restarts from,
    # whether its probe passes, restarts so far, the probe's error or why it restarts.
    serve: dict | None = None
    spec: dict | None = None
    ready: bool = False
    restarts: int = 0
    detail: str = ""
    restart_at: float | None = None
    backoff: int = 0
    launched_at: float | None = None
    # A container member with a memory limit: the node's OOM-kill count at its launch
    # (containers.oom_ended).
    oom_kills: int | None = None

    def reported(self) -> tuple:
        """What the console is told: a change in any of it is reported."""
        return (
            self.state,
            self.exit_code,
            self.reason,
            self.cleaned,
            self.confinement,
            self.ready,
            self.restarts,
            self.detail,
        )

    @property
    def holds_cards(self) -> bool:
        return self.kind == START and not self.cleaned


def process_start_time(pid: int) -> str | None:
    """A process's start time in clock ticks since boot: with the boot id, who it is (R6)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
