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
