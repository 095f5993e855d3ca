"""Serving members: a deployment's replicas (S1). Started like a job's member, but long-running.

A replica's process is restarted by the agent whenever it exits — with a backoff, counted —
until the console stops it; only a stop or a cleanup ends it. Its readiness is the agent's
to judge: an HTTP GET on 127.0.0.1:``port````readiness_path`` every PROBE_INTERVAL seconds
with a PROBE_TIMEOUT; FAILURES_TO_UNREADY failures in a row make it not ready, one success
makes it ready. Only a change is reported (ready, restarts, the probe's error), so a
console with many replicas writes nothing while nothing changes.
"""

import http.client
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

logger = logging.getLogger("tuneplane-node")

PROBE_INTERVAL = 5.0
# Until a replica is first Ready its probe runs every second (as a startup probe): a replica
# is Ready about a second after it listens, not up to an interval later.
STARTUP_INTERVAL = 1.0
PROBE_TIMEOUT = 2.0
TICK = 0.5
FAILURES_TO_UNREADY = 3
RESTART_FIRST = 1.0
RESTART_MAX = 60.0
# A process that ran this long before it exited starts its backoff afresh.
RESTART_RESET_AFTER = 300.0
MAX_DETAIL = 200


def spec_of(payload: dict) -> dict | None:
    """A start's ``serve``: the port and readiness path, or None (a job's member)."""
    serve = payload.get("serve")
    if not isinstance(serve, dict):
        return None
    port, path = serve.get("port"), serve.get("readiness_path") or "/"
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        return None
    if not isinstance(path, str) or not path.startswith("/") or any(c <= " " for c in path):
        path = "/"
    return {"port": port, "readiness_path": path}


def restart_delay(restarts: int) -> float:
    """Seconds before restart number ``restarts + 1``: 1 s, doubling, at most a minute."""
    return min(RESTART_MAX, RESTART_FIRST * 2 ** min(restarts, 16))


def restart_after_exit(command, code: int, reason: str, now: float) -> bool:
    """A replica's process ended. Unless it is being stopped, schedule its restart and say
    why in ``detail``; returns whether it restarts (its state stays running)."""
    if command.serve is None or command.stop_at is not None or command.cleanup_wanted:
        return False
    if command.launched_at and now - command.launched_at >= RESTART_RESET_AFTER:
        command.backoff = 0
    why = "out of memory" if reason == "oom" else f"exited with {code}"
    if reason in ("vanished", "node_rebooted"):
        why = "node rebooted" if reason == "node_rebooted" else "process vanished"
    delay = restart_delay(command.backoff)
    command.restart_at, command.backoff = now + delay, command.backoff + 1
    command.ready, command.pid, command.started = False, None, None
    command.reason, command.detail = "restarting", f"{why}; restarting in {delay:.0f}s"[:MAX_DETAIL]
    return True


def probe(port: int, path: str, timeout: float = PROBE_TIMEOUT) -> str:
    """GET 127.0.0.1:port+path: "" when it answers 2xx or 3xx, else why not (a short,
    stable text: the same failure twice is no change to report)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
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
    """Probes every running replica of ``commands`` on its own schedule, in a thread of its
    own that outlives any one stream (a replica is probed while the console is away too)."""

    def __init__(
        self, commands, *, interval: float = PROBE_INTERVAL, startup: float = STARTUP_INTERVAL
    ):
        self.commands = commands
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
        for command in self.commands.serving():
            member_id = command.command_id
            with self.lock:
                if member_id in self.pending or now < self.due.get(member_id, 0.0):
                    continue
                self.pending.add(member_id)
                started = self.launches.get(member_id) == command.launched_at
                self.due[member_id] = now + (self.interval if started else self.startup)
            self.pool.submit(self._probe, member_id, command.serve, command.launched_at)

    def _probe(self, member_id: str, serve: dict, launched_at: float | None) -> None:
        try:
            error = probe(serve["port"], serve["readiness_path"])
            with self.lock:
                failures = 0 if not error else self.failures.get(member_id, 0) + 1
                self.failures[member_id] = failures
                if not error:
                    self.launches[member_id] = launched_at
            self.commands.probed(member_id, error, failures >= FAILURES_TO_UNREADY)
        finally:
            with self.lock:
                self.pending.discard(member_id)


def probed(command, error: str, unready: bool) -> bool:
    """A probe's answer applied to a running replica; returns whether anything changed.
    One success makes it ready; once ready, only FAILURES_TO_UNREADY failures in a row
    make it not ready. Before its first success it is not ready, and says why."""
    before = (command.ready, command.detail)
    if not error:
        command.ready, command.detail = True, ""
    elif unready or not command.ready:
        command.ready, command.detail = False, error[:MAX_DETAIL]
    return (command.ready, command.detail) != before


class ServingCommands:
    """What nodes.agent.commands.Commands does for its replicas."""

    def _restart_due(self, command):
        """A replica waiting out its restart backoff: stopped meanwhile, it ends; due, its
        process starts again from the start it was given."""
        if command.stop_at is not None or command.cleanup_wanted:
            command.state, command.reason, command.restart_at = "failed", "stopped", None
            command.exit_code = -1 if command.exit_code is None else command.exit_code
            if command.cleanup_wanted:
                self._clean(command)
            self.save(command)
        elif time.time() >= command.restart_at:
            command.restart_at, command.restarts, command.reason = None, command.restarts + 1, ""
            self._path(command.command_id, ".exit").unlink(missing_ok=True)
            self._launch(command, command.spec or {})
        return command

    def serving(self) -> list:
        """Replicas whose process runs now: what the readiness probe asks."""
        return [
            command
            for command in self.known()
            if command.serve is not None
            and command.state == "running"
            and command.restart_at is None
            and command.stop_at is None
        ]

    def probed(self, member_id: str, error: str, unready: bool) -> None:
        with self.lock:
            command = self.get(member_id)
            if (
                command is not None
                and command.state == "running"
                and command.restart_at is None
                and command.stop_at is None
                and probed(command, error, unready)
            ):
                self.save(command)
