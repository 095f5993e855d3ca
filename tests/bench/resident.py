"""A process's resident memory by where glibc's malloc and Python put it, read from
/proc/PID/smaps: which part of a gateway's RSS grows over a long window (issue 20).

glibc's main arena is the ``[heap]`` (brk) of the process; every other arena is made of
heaps mapped at an address aligned to their maximum size, 64 MiB on a 64-bit system
(``HEAP_MAX_SIZE`` in malloc/arena.c), none larger. What is left is anonymous memory of
other kinds (Python's own allocator, thread stacks, a large block malloc mapped alone) and
files (the libraries' pages). An unrelated mapping that happens to start on such an
address is counted as a thread heap: a reading, not an accounting.
"""

from pathlib import Path

THREAD_HEAP_SIZE = 64 * 2**20
KINDS = ("main heap", "thread heaps", "other anonymous", "files")


def resident_of(pid: int) -> dict[str, float]:
    return resident_by_kind(Path(f"/proc/{pid}/smaps").read_text())


def resident_by_kind(text: str) -> dict[str, float]:
    """Resident MiB by kind (KINDS), and ``thread heap count``, from the text of
    /proc/PID/smaps."""
    resident = dict.fromkeys(KINDS, 0)
    heaps = 0
    kind = None
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's first line
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            name = fields[5] if len(fields) > 5 else ""
            if name == "[heap]":
                kind = "main heap"
            elif name.startswith("/"):
                kind = "files"
            elif (
                not name
                and fields[1].startswith("rw")
                and start % THREAD_HEAP_SIZE == 0
                and end - start <= THREAD_HEAP_SIZE
            ):
                kind = "thread heaps"
                heaps += 1
            else:
                kind = "other anonymous"
        elif fields[0] == "Rss:":
            resident[kind] += int(fields[1]) * 1024
    return {kind: size / 2**20 for kind, size in resident.items()} | {"thread heap count": heaps}
