"""A gateway replica's garbage collector: what it costs the streams, and how that is kept small.

A heartbeat's ack waits for whatever the event loop is doing, and a full collection walks
every tracked object the process holds: at 10,000 streams that was the gateway's worst ack
latency (issue 20). Two measures: once the replica is built, everything made at start-up
(Django, grpc, protobuf — several hundred thousand objects) is moved out of the
collector's sight (``gc.freeze``): it lives as long as the process, so no collection could
free any of it. And every collection's pause is timed, by generation, for Prometheus
(``tuneplane_gateway_gc_pause_seconds``), so a long one is seen, not guessed at.

Below Python, the C allocator's heap: its free pages handed back on a timer (``Trimmer``), and
its arenas capped where the operator says (``limit_arenas``, TUNEPLANE_GATEWAY_MALLOC_ARENAS).
glibc's own limit is the default: under 10,000 streams the RSS grows for ten minutes and then
stays in a band with or without a cap, and on a quiet machine a cap did not change a
10,000-node restart (issue 20; README, "A gateway at fleet scale").
"""

import ctypes
import ctypes.util
import functools
import gc
import os
import threading
import time

from prometheus_client import Counter, Histogram

GC_PAUSE = Histogram(
    "tuneplane_gateway_gc_pause_seconds",
    "One garbage collection's pause of the gateway's event loop, by generation.",
    ["generation"],
    buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
)


# Allocations between two young collections (CPython's default: 700). A young collection
# promotes whatever is alive at that moment, and a full one follows once promotions reach a
# quarter of the old generation: at 700, an ack or a lease entry alive for a few milliseconds
# is promoted, and at 10,000 streams full collections came every few seconds. At 50,000, a
# young collection costs a few milliseconds and only what outlives it is promoted.
YOUNG_THRESHOLD = 50_000


def freeze_start_up() -> int:
    """Collect once, then leave what is left of start-up to live untraced; young collections
    made rarer (YOUNG_THRESHOLD). How many objects were frozen."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
    return gc.get_freeze_count()


class PauseTimer:
    """A ``gc.callbacks`` entry timing each collection."""

    def __init__(self):
        self.started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        else:
            GC_PAUSE.labels(str(info["generation"])).observe(time.perf_counter() - self.started)


def time_pauses() -> None:
    if not any(isinstance(callback, PauseTimer) for callback in gc.callbacks):
        gc.callbacks.append(PauseTimer())


# glibc's malloc, which grpc's core (and every C extension) allocates from, returns a freed
# page to the kernel only from the top of a heap: under 10,000 long-lived streams the
# gateway's RSS went on growing by 70–100 MiB an hour while Python's own blocks did not (README,
# "A gateway at fleet scale"). The free pages are handed back once a minute.
TRIM_SECONDS = 60.0
M_ARENA_MAX = -8  # malloc.h

MALLOC_TRIM = Histogram(
    "tuneplane_gateway_malloc_trim_seconds",
    "One malloc_trim(0) of the gateway's native heap (on a thread of its own, not the loop's).",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
)
MALLOC_TRIM_RELEASED = Counter(
    "tuneplane_gateway_malloc_trim_released_bytes_total",
    "Resident memory the periodic malloc_trim handed back to the kernel.",
)


@functools.cache
def _glibc():
    """The C library, where it is glibc (musl has neither malloc_trim nor mallopt's arenas)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def limit_arenas(count: int) -> bool:
    """Cap glibc's arenas at ``count``, before the server's threads start (0: glibc's own
    limit, left alone). Whether the C library took it."""
    libc = _glibc()
    return bool(count and libc and libc.mallopt(M_ARENA_MAX, count))


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def trim() -> int:
    """Hand the native heap's free pages back to the kernel; the resident bytes released.
    ctypes lets go of the GIL for the call, so Python threads run on meanwhile."""
    libc = _glibc()
    if libc is None:
        return 0
    before = resident_bytes()
    with MALLOC_TRIM.time():
        libc.malloc_trim(0)
    released = max(before - resident_bytes(), 0)
    MALLOC_TRIM_RELEASED.inc(released)
    return released


class Trimmer(threading.Thread):
    """``trim`` every ``every`` seconds until ``stop``."""

    def __init__(self, every: float = TRIM_SECONDS):
        super().__init__(name="malloc-trim", daemon=True)
        self.every, self.stopping = every, threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.every):
            trim()

    def stop(self) -> None:
        self.stopping.set()
