"""A gateway replica's garbage collector: what it costs the streams, and how that is kept small.

A heartbeat's ack waits for whatever the event loop is doing, and a full collection walks
every tracked object the process holds: at 10,000 streams that was the gateway's worst ack
latency (issue 20). Two measures: once the replica is built, everything made at start-up
(Django, grpc, protobuf — several hundred thousand objects) is moved out of the
collector's sight (``gc.freeze``): it lives as long as the process, so no collection could
free any of it. And every collection's pause is timed, by generation, for Prometheus
(``tuneplane_gateway_gc_pause_seconds``), so a long one is seen, not guessed at.
"""

import gc
import time

from prometheus_client import Histogram

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
