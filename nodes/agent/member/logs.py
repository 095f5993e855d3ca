"""A member's output: one file per member in the state dir's ``logs/``, read for the
console's log requests (its tail, or what was written from an offset on) and kept a while
after the member is forgotten.

Offsets count the member's output from its first byte ever written, across cuts (R16): a
cut file starts with CUT_NOTE and then its oldest kept byte, whose offset is in the file
beside it (``<member>.offset``). A file never cut has no such file: its bytes are its
offsets. The cut and the reads take one lock, so a read never sees a file rewritten but
its offset not yet (the cut runs on the tick's thread, reads on the stream's) — nor in another
process: a confined member's keeper (shim.py) cuts its log as it writes, and the lock is also
an flock on the log file itself."""

import contextlib
import fcntl
import os
import threading
import time
from collections import namedtuple
from pathlib import Path

_cutting = threading.Lock()


@contextlib.contextmanager
def _locked(handle, kind: int):
    """The log file locked against a cut in another process (shared: a read; exclusive: a
    cut), beside the thread lock held around it."""
    fcntl.flock(handle.fileno(), kind)
    try:
        yield
    finally:
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


# A read of a member's log: its data; where data starts in the member's output; just past
# it; whether what was asked for reaches before the oldest byte kept. A plain tuple, not a
# dataclass: the keeper imports this module, and a member's start waits on the keeper's.
Read = namedtuple("Read", "data offset next_offset truncated")


def _offset_file(path: Path) -> Path:
    return path.with_suffix(".offset")


def _kept_from(path: Path) -> tuple[int, int]:
    """The offset of the oldest byte kept, and where it is in the file (after CUT_NOTE)."""
    try:
        return int(_offset_file(path).read_text()), len(CUT_NOTE)
    except (OSError, ValueError):
        return 0, 0


def read(path: Path, limit: int, offset: int | None = None) -> Read | None:
    """Up to ``limit`` bytes from ``offset`` on (the oldest kept when the log was cut past it;
    the end when asked past it), or the last ``limit`` without one. Only what is returned is
    read: the file is seeked to it. None when the member has no log here."""
    with _cutting:
        try:
            with path.open("rb") as handle, _locked(handle, fcntl.LOCK_SH):
                oldest, header = _kept_from(path)
                end = oldest + max(handle.seek(0, os.SEEK_END) - header, 0)
                if offset is None:
                    start, truncated = max(oldest, end - limit), oldest > 0 and end - limit < oldest
                else:
                    start, truncated = min(max(offset, oldest), end), offset < oldest
                handle.seek(header + start - oldest)
                data = handle.read(limit)
        except FileNotFoundError:
            return None
        except OSError:
            data, start, truncated = b"", 0, False
    return Read(data=data, offset=start, next_offset=start + len(data), truncated=truncated)


def du(path: Path) -> int:
    """Bytes a directory tree holds on disk, its symlinks not followed."""
    total = 0
    stack = [path]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += info.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
    return total


CUT_NOTE = b"[tuneplane-node: older output removed at this member's log limit]\n"


def cut(path: Path, limit: int) -> bool:
    """R16: a log past ``limit`` bytes keeps its newest half, in place. The member's output
    is appended (O_APPEND), so what it writes next lands after what is kept. Whether it cut."""
    with _cutting:
        try:
            with path.open("r+b") as handle, _locked(handle, fcntl.LOCK_EX):
                size = os.fstat(handle.fileno()).st_size
                if size <= limit:
                    return False
                keep = max(limit // 2 - len(CUT_NOTE), 0)
                oldest, header = _kept_from(path)
                handle.seek(size - keep)
                newest = handle.read(keep)
                handle.seek(0)
                handle.write(CUT_NOTE + newest)
                handle.truncate()
                written = _offset_file(path).with_suffix(".offset-new")
                written.write_text(str(oldest + size - header - keep))
                os.replace(written, _offset_file(path))
            return True
        except OSError:
            return False


def expired(logs: Path, retention_seconds: float, keep: set[str]) -> list[Path]:
    """Log files of members no longer known, older than the retention, with their offset
    files."""
    if not logs.is_dir():
        return []
    cutoff = time.time() - retention_seconds
    old = [
        path
        for path in logs.glob("*.log")
        if path.stem not in keep and path.stat().st_mtime < cutoff
    ]
    return old + [_offset_file(path) for path in old if _offset_file(path).exists()]
