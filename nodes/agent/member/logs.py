"""A member's output: one file per member in the state dir's ``logs/``, read from its end
for the console's log requests and kept a while after the member is forgotten."""

import os
import time
from pathlib import Path


def tail(path: Path, tail_bytes: int) -> bytes:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - tail_bytes))
            return handle.read()
    except OSError:
        return b""


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
    try:
        size = path.stat().st_size
        if size <= limit:
            return False
        keep = max(limit // 2 - len(CUT_NOTE), 0)
        with path.open("r+b") as handle:
            handle.seek(size - keep)
            newest = handle.read(keep)
            handle.seek(0)
            handle.write(CUT_NOTE + newest)
            handle.truncate()
        return True
    except OSError:
        return False


def expired(logs: Path, retention_seconds: float, keep: set[str]) -> list[Path]:
    """Log files of members no longer known, older than the retention."""
    if not logs.is_dir():
        return []
    cutoff = time.time() - retention_seconds
    return [
        path
        for path in logs.glob("*.log")
        if path.stem not in keep and path.stat().st_mtime < cutoff
    ]
