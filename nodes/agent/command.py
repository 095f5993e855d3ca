"""A command as the agent keeps it in its state dir (executor.py): ``run`` (a process of its
own), or the answer to a ``stop`` or ``cleanup`` of a member. A member's own record, made by
a ``start``, is member/record.py's."""

import re
from dataclasses import dataclass, field
from pathlib import Path

from .member.record import FAILED, RUNNING, START, SUCCEEDED  # noqa: F401 -- one set of states

STOP, CLEANUP = "stop", "cleanup"
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
    argv: list = field(default_factory=list)
    state: str = RUNNING
    exit_code: int | None = None
    pid: int | None = None
    started: str | None = None  # the process's start time in /proc, against pid reuse
    reason: str = ""

    def reported(self) -> tuple:
        """What the console is told: a change in any of it is reported."""
        return (self.state, self.exit_code, self.reason)

    holds_cards = False


def process_start_time(pid: int) -> str | None:
    """A process's start time in clock ticks since boot: with the boot id, who it is (R6)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
