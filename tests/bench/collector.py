"""A load generator's own garbage collection: its pauses timed, and its long-lived streams'
objects frozen out of it, so that the generator's pauses are not read as the console's."""

import gc
import time


class Collections:
    """Times this process's collections once ``counting`` is set, when its streams are all
    up (``pause_max``, seconds); ``freeze`` keeps the objects alive now out of them."""

    def __init__(self):
        self.counting = False
        self.pause_max = 0.0
        self._started = 0.0
        gc.callbacks.append(self._timed)

    def _timed(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self.counting:
            self.pause_max = max(self.pause_max, time.perf_counter() - self._started)

    @staticmethod
    def freeze() -> None:
        """Every object alive now lives until the end: frozen, full collections no longer
        re-scan them (at 10,000 streams such a pass pauses the loop for up to a second)."""
        gc.collect()
        gc.freeze()
