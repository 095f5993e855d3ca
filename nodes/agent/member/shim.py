"""A confined member's keeper (R18, R21), what conmon is to Podman: a small process of the
agent's, root's, in a session of its own, that outlives the agent (R6). It starts the member
with the OCI runtime's ``run --detach`` from the member's bundle, is the parent of the
member's PID 1 (a child subreaper), takes the member's output through a pipe into its log —
never more than the log's cap plus one read (64 KiB) on disk, the newest half kept at each cut
(logs.cut) — and writes how the member ended, atomically, to its exit file.

It is run as ``python -I -m <this module>`` with a fixed environment: nothing of the member's
env or of the node's reaches it (R17). It is not in the member's cgroup: killing the member's
cgroup ends the member, never its keeper, which then records the kill.

    python -I -S -c <boot> RUNTIME STATE_ROOT BUNDLE ID EXIT_FILE LOG_FILE CAP [GO_FD]

CAP is the log's cap in bytes, 0 for none. With GO_FD it waits for the agent's word on that
pipe before it runs the member (the agent wires its network meanwhile); without it, at once.
The exit code is the member's, 128 + N for a member ended by signal N, and START_FAILED when
the runtime could not start it (its words are in the log) or the agent never said to.
"""

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import logs

READ = 64 * 1024  # the most one read takes from the pipe: what a log may be past its cap
START_FAILED = 125
GO = b"1"  # sandbox.GO: the agent's word to run the member
PR_SET_CHILD_SUBREAPER = 36
POLL = 0.5  # seconds between looks for the member's end while its output is quiet
DRAIN = 2.0  # how long output still open after the member's PID 1 ended is read


def set_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


class CappedLog:
    """Appends to a member's log and keeps it at most ``cap`` + READ bytes long (R21)."""

    def __init__(self, path: Path, cap: int):
        self.path, self.cap = path, cap
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self.fd, view[:READ])
            view = view[written:]
            if self.cap and os.fstat(self.fd).st_size > self.cap:
                logs.cut(self.path, self.cap)

    def close(self) -> None:
        os.close(self.fd)


def status_code(status: int) -> int:
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return START_FAILED


def write_exit(path: Path, code: int) -> None:
    written = path.with_name(path.name + ".tmp")
    written.write_text(f"{code}\n")
    os.replace(written, path)


def reap(pid: int | None) -> int | None:
    """Every child that ended reaped (a subreaper inherits the member's orphans too); the
    status of ``pid`` if it was among them."""
    found = None
    while True:
        try:
            child, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if child == 0:
            return found
        if child == pid:
            found = status


def keep(runtime: str, state_root: str, bundle: Path, name: str, log: CappedLog) -> int:
    """Start the member, carry its output, return its exit code."""
    reader, writer = os.pipe()
    pid_file = bundle / "init.pid"
    pid_file.unlink(missing_ok=True)
    argv = [runtime, "--root", state_root, "run", "--detach", "--pid-file", str(pid_file)]
    argv += ["--bundle", str(bundle), name]
    started = subprocess.run(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=writer,
        stderr=writer,
        cwd=bundle,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        check=False,
    )
    os.close(writer)  # the member holds the only other ends now
    init = None
    if started.returncode == 0:
        with contextlib.suppress(OSError, ValueError):
            init = int(pid_file.read_text().strip())
    status, drain_until = None, None
    while True:
        ready, _, _ = select.select([reader], [], [], POLL)
        if ready:
            data = os.read(reader, READ)
            if not data:
                break
            log.write(data)
        if status is None and init is not None:
            status = reap(init)
            if status is not None:
                drain_until = time.monotonic() + DRAIN
        elif init is None and not ready:
            break  # it never started, and the runtime said why
        if drain_until is not None and time.monotonic() > drain_until:
            break
    os.close(reader)
    if init is None:
        return START_FAILED
    while status is None:  # its output closed before it ended
        try:
            _, status = os.waitpid(init, 0)
        except ChildProcessError:
            return START_FAILED  # reaped elsewhere: not ours to know
    reap(None)
    return status_code(status)


def go_word(fd: int) -> bool:
    """Whether the agent said to run the member: the word on the pipe it started us with
    (started before the member's network and bundle were ready); EOF is no."""
    try:
        return os.read(fd, len(GO)) == GO
    except OSError:
        return False
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    runtime, state_root, bundle, name, exit_file, log_file, cap, *go = argv
    # A stop is the agent's, sent to the member's cgroup; the keeper stays to record it.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    set_subreaper()
    log = CappedLog(Path(log_file), int(cap))
    if go and not go_word(int(go[0])):
        log.close()
        write_exit(Path(exit_file), START_FAILED)
        return 0
    try:
        code = keep(runtime, state_root, Path(bundle), name, log)
    finally:
        log.close()
    write_exit(Path(exit_file), code)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
