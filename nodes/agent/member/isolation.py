"""Whom a member runs as (R11, R20): an unprivileged uid of its own, taken from the agent's
range (``--member-uids``, 61000–64999 by default, as systemd's DynamicUser or Slurm's job
user do), never handed out while a member holds it uncleaned or a process runs as it. What
confines it is the OCI runtime's (bundle.py, sandbox.py).
"""

import re
from pathlib import Path

DEFAULT_UIDS = "61000-64999"
# NVIDIA's character major: card N is /dev/nvidiaN, 195:N (bundle.card_devices).
NVIDIA_MAJOR = 195


def uid_range(text: str | None) -> tuple[int, int] | None:
    """``"61000-64999"`` as (first, last); "" or "none": members run as the agent's user."""
    text = (text or "").strip()
    if text.lower() in ("", "none"):
        return None
    found = re.fullmatch(r"(\d+)-(\d+)", text)
    if not found or not 1000 <= int(found[1]) <= int(found[2]) < 2**31:
        raise ValueError(f"a uid range is FIRST-LAST, both 1000 or more: {text!r}")
    return int(found[1]), int(found[2])


def pick_uid(first: int, last: int, taken: set[int]) -> int | None:
    """The lowest uid of the range that no member holds and no process runs as: a uid is
    never reused while a process of it is alive (R11). None when the range is used up."""
    return next((uid for uid in range(first, last + 1) if uid not in taken), None)


def uids_running() -> set[int]:
    """The real uids of every process on this machine now."""
    found = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.startswith("Uid:"):
                    found.add(int(line.split()[1]))
                    break
        except (OSError, ValueError, IndexError):
            continue
    return found


def char_major(name: str) -> int | None:
    try:
        text = Path("/proc/devices").read_text()
    except OSError:
        return None
    block = text.split("Block devices:")[0]
    for line in block.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == name and parts[0].isdigit():
            return int(parts[0])
    return None
