"""The wall between members on one node (R11–R13): each member runs under an unprivileged uid
of its own, taken from the agent's range (``--member-uids``, 61000–64999 by default, as
systemd's DynamicUser or Slurm's job user do), with ``no_new_privs`` and no capabilities, in
a PID namespace of its own (it sees only its own processes) with a private ``/tmp`` and
``/dev/shm``; its cgroup allows only its own cards' device files (R12) and a number of
processes, and it cannot leave it (the cgroup's files are root's). The agent's state dir,
other members' logs and scratch, and the start payloads are root's, 0700/0600.

What runs: the root wrapper (launch.WRAPPER) joins the member's cgroups, then ``unshare``
makes the namespaces and runs INIT as their PID 1, as root still: it mounts the private
``/tmp``, starts the member through ``setpriv`` as its uid and passes a stop's SIGTERM on
(a namespace's PID 1 gets only the signals it handles).
"""

import os
import re
import shutil
from pathlib import Path

# "$1" is the member's uid; its argv follows; it runs in its scratch dir. A scratch dir under
# /tmp (an agent whose state dir is there) is bound back at its path in the private /tmp, so
# that the member names it by its path (TUNEPLANE_SCRATCH_DIR) as anywhere else.
INIT = (
    "uid=$1; shift; here=$(pwd -P); "
    "mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp || exit 125; "
    "mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm 2>/dev/null; "
    'case "$here" in /tmp/*|/dev/shm/*) mkdir -p "$here" && '
    'mount -c --bind /proc/self/cwd "$here" || exit 125;; esac; '
    'setpriv --reuid="$uid" --regid="$uid" --clear-groups --no-new-privs --inh-caps=-all '
    '--bounding-set=-all -- "$@" & child=$!; '
    "trap 'kill -TERM $child 2>/dev/null' TERM; "
    'wait "$child"; code=$?; '
    'while kill -0 "$child" 2>/dev/null; do wait "$child"; code=$?; done; exit "$code"'
)
UNSHARE = ["--pid", "--fork", "--mount", "--propagation", "private", "--mount-proc"]
DEFAULT_UIDS = "61000-64999"
# Device files every CUDA process needs beside its cards' (char major:minor): null, zero,
# full, random, urandom, tty, ptmx, the ptys; nvidiactl and nvidia-modeset; nvidia-uvm's
# and nvidia-caps' majors are read from /proc/devices.
BASIC_DEVICES = ["c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm"]
BASIC_DEVICES += ["c 5:0 rwm", "c 5:2 rwm", "c 136:* rwm", "c 195:255 rwm", "c 195:254 rwm"]
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


def unavailable() -> str:
    """Why members cannot be isolated here ("" when they can): the agent must be root, with
    util-linux's unshare and setpriv."""
    if os.geteuid() != 0:
        return "the agent is not root"
    missing = [tool for tool in ("unshare", "setpriv") if shutil.which(tool) is None]
    return f"no {' or '.join(missing)} on this node" if missing else ""


def wrap(argv: list[str], uid: int) -> list[str]:
    """The member's argv, run as ``uid`` in namespaces of its own."""
    return [shutil.which("unshare") or "unshare", *UNSHARE, "/bin/sh", "-c", INIT, "init"] + [
        str(uid),
        *argv,
    ]


def device_rules(card_indices) -> list[str]:
    """The devices cgroup's allow list (after "a" is denied): the basic devices, NVIDIA's
    control devices and exactly the member's cards (``/dev/nvidiaN`` is 195:N)."""
    rules = list(BASIC_DEVICES)
    for name in ("nvidia-uvm", "nvidia-caps"):
        major = char_major(name)
        if major is not None:
            rules.append(f"c {major}:* rwm")
    rules += [f"c {NVIDIA_MAJOR}:{index} rwm" for index in sorted(card_indices)]
    return rules


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
