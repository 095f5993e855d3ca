"""A replica's readiness (S1): an HTTP GET on 127.0.0.1:``port````readiness_path`` every
PROBE_INTERVAL seconds with a PROBE_TIMEOUT, in a thread of the agent's own that outlives
any one stream (a replica is probed while the console is away too). What an answer changes
is member/policy.py's ``probed``; only a change is written, and so reported."""

import http.client
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from .policy import MAX_DETAIL

logger = logging.getLogger("tuneplane-node")

PROBE_INTERVAL = 5.0
# Until a replica is first Ready its probe runs every second (as a startup probe): a replica
# is Ready about a second after it listens, not up to an interval later.
STARTUP_INTERVAL = 1.0
PROBE_TIMEOUT = 2.0
TICK = 0.5


def probe(port: int, path: str, timeout: float = PROBE_TIMEOUT, host: str = "") -> str:
    """GET host:port+path — a confined member's own address (R19: nothing but its process
    can answer there), else 127.0.0.1 — "" when it answers 2xx or 3xx, else why not (a
    short, stable text: the same failure twice is no change to report)."""
    connection = http.client.HTTPConnection(host or "127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path, headers={"User-Agent": "tuneplane-node probe"})
        status = connection.getresponse().status
    except TimeoutError:
        return f"probe timed out after {timeout:.0f}s"
    except ConnectionRefusedError:
        return f"connection refused on port {port}"
    except (OSError, http.client.HTTPException) as error:
        return f"probe failed: {type(error).__name__}"[:MAX_DETAIL]
    finally:
        connection.close()
    return "" if 200 <= status < 400 else f"HTTP {status} from {path}"[:MAX_DETAIL]


class Prober:
    """Probes every serving replica of a runner on its own schedule."""

    def __init__(
        self, runner, *, interval: float = PROBE_INTERVAL, startup: float = STARTUP_INTERVAL
    ):
        self.runner = runner
        self.interval, self.startup = interval, startup
        self.launches: dict[str, float | None] = {}  # the launch each replica was Ready in
        self.due: dict[str, float] = {}
        self.failures: dict[str, int] = {}
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="probe")
        self.pending: set[str] = set()
        self.lock = threading.Lock()

    def run(self, stopping: threading.Event) -> None:
        while not stopping.wait(TICK):
            try:
                self.tick(time.monotonic())
            except Exception:  # a probe pass never takes the agent down
                logger.exception("readiness probes failed")

    def tick(self, now: float) -> None:
        for member in self.runner.serving():
            member_id = member.command_id
            with self.lock:
                if member_id in self.pending or now < self.due.get(member_id, 0.0):
                    continue
                self.pending.add(member_id)
                started = self.launches.get(member_id) == member.launched_at
                self.due[member_id] = now + (self.interval if started else self.startup)
            self.pool.submit(
                self._probe, member_id, member.serve, member.launched_at, member.address
            )

    def _probe(
        self, member_id: str, serve: dict, launched_at: float | None, address: str = ""
    ) -> None:
        try:
            error = probe(serve["port"], serve["readiness_path"], host=address)
            with self.lock:
                failures = 0 if not error else self.failures.get(member_id, 0) + 1
                self.failures[member_id] = failures
                if not error:
                    self.launches[member_id] = launched_at
            self.runner.probed(member_id, error, failures, launched_at)
        finally:
            with self.lock:
                self.pending.discard(member_id)
