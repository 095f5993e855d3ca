"""``make run``'s processes kept running: one that dies is started again after a backoff, with
one line saying which, how it ended and when it comes back; the console stops only when asked.

Each process's output goes to its own file (``var/log/NAME.log``); the terminal is given only
its warnings and errors. The decisions — how long to wait before a restart, how an exit is
named, which lines of output the terminal shows — are pure functions, tested without
processes; ``Supervisor`` only starts, reaps and pumps."""

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

LOG_DIR = "log"
# A log this large is moved to NAME.log.1 (the one before it dropped): a console left running
# for weeks keeps two of them per process, whatever its processes say.
LOG_BYTES = 50_000_000


@dataclass(frozen=True)
class Backoff:
    """How long a process that died waits before it is started again: ``first`` after a
    process that had been up ``steady`` seconds or more (a crash now and then), else twice the
    last wait, up to ``ceiling`` (a process that cannot start is tried again once a minute,
    not in a loop)."""

    first: float = 1.0
    factor: float = 2.0
    ceiling: float = 60.0
    steady: float = 60.0

    def delay(self, *, previous: float | None, uptime: float) -> float:
        if previous is None or uptime >= self.steady:
            return self.first
        return min(self.ceiling, previous * self.factor)


BACKOFF = Backoff()


def exit_reason(returncode: int) -> str:
    """How a process ended, as ``Popen.returncode`` tells it (a signal is negative)."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with {returncode}"


def duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


# A log record's level near its start: Celery's "[time: WARNING/MainProcess] ...", the
# console's own "time WARNING logger message".
_LEVEL = re.compile(r"^.{0,40}?[\[\s:](DEBUG|INFO|WARNING|ERROR|CRITICAL)[/\s\]]")
LOUD_LEVELS = {"WARNING", "ERROR", "CRITICAL"}
ERROR_LEVELS = {"ERROR", "CRITICAL"}
# Django's line per request: a client's 4xx is the client's answer, not the operator's news.
_REQUEST = re.compile(r"\sWARNING\s+django\.(server|request)\s")
# kombu at every start of a worker or beat on the embedded broker, whose URL names no host.
HARMLESS = ("No hostname was supplied. Reverting to default 'localhost'",)
# What a process says when it dies outside its logging: a traceback, "CommandError: ...".
_CRASH = re.compile(
    r"^(Traceback \(most recent call last\)|[\w.]*(Error|Exception|Configured)\b[^:]*:)"
)


def shown(line: str, *, in_error: bool) -> tuple[bool, bool]:
    """Whether the terminal shows this line of a process's output, and whether the lines
    after it go on with an error. Shown: warnings and errors, an error's traceback, and what a
    process prints as it dies outside its logging; never INFO, nor a process's start-up
    chatter (Celery's banner, runserver's). ``in_error``: what the line before it left."""
    level = _LEVEL.match(line)
    if level:
        name = level.group(1)
        loud = name in LOUD_LEVELS and not _REQUEST.search(line)
        loud = loud and not any(harmless in line for harmless in HARMLESS)
        return loud, loud and name in ERROR_LEVELS
    if _CRASH.match(line):
        return True, True
    if in_error:
        return bool(line.strip()), True
    return False, False


@dataclass
class Child:
    """One supervised process: its command, the one running now, and its restart history."""

    name: str
    command: list[str]
    log: Path
    process: subprocess.Popen | None = None
    started: float = 0.0
    delay: float | None = None  # the last wait before a restart
    restart_at: float | None = None  # set while it waits to be started again
    restarts: int = 0
    pumps: list[threading.Thread] = field(default_factory=list)


class Supervisor:
    """Starts ``commands`` (name -> argv), each in a session of its own with its output
    written to ``log_dir/NAME.log`` (the last start's, or the part past ``log_bytes``, kept as
    ``NAME.log.1``), and keeps them running until ``stop()``. ``say`` is given
    each line the terminal shows."""

    def __init__(
        self,
        commands: dict[str, list[str]],
        *,
        log_dir: Path,
        say: Callable[[str], None],
        backoff: Backoff = BACKOFF,
        clock: Callable[[], float] = time.monotonic,
        log_bytes: int = LOG_BYTES,
    ):
        log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        log_dir.chmod(0o700)  # R23: the processes' output is the console's own
        self.children = {
            name: Child(name, command, log_dir / f"{name}.log")
            for name, command in commands.items()
        }
        self.say_line = say
        self.backoff = backoff
        self.clock = clock
        self._saying = threading.Lock()
        self.stopping = False
        self.log_bytes = log_bytes
        self._files: dict[str, object] = {}
        for child in self.children.values():
            self._open_log(child)

    def say(self, text: str) -> None:
        with self._saying:
            self.say_line(f"{time.strftime('%H:%M:%S')} {text}")

    def pid(self, name: str) -> int | None:
        process = self.children[name].process
        return process.pid if process is not None and process.poll() is None else None

    def start_all(self) -> None:
        for child in self.children.values():
            self._start(child)

    def check(self) -> None:
        """One pass: a process that ended is named and its restart scheduled; one whose
        wait is over is started again. Nothing, once stopping."""
        if self.stopping:
            return
        now = self.clock()
        for child in self.children.values():
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.restart_at = None
                    child.restarts += 1
                    self._start(child)
                continue
            if child.process is None or child.process.poll() is None:
                continue
            self._kill_group(child.process)  # what it left behind (a worker's pool) goes too
            uptime = now - child.started
            child.delay = self.backoff.delay(previous=child.delay, uptime=uptime)
            child.restart_at = now + child.delay
            ended = exit_reason(child.process.returncode)
            self._write(child, f"==== {time.strftime('%F %T')} {ended} ====\n")
            self.say(
                f"{child.name} (pid {child.process.pid}) {ended} "
                f"after {duration(uptime)} up; restarting in {duration(child.delay)}, at "
                f"{time.strftime('%H:%M:%S', time.localtime(time.time() + child.delay))} "
                f"(its log: {child.log})"
            )

    def stop(self, grace: float) -> list[str]:
        """SIGTERM to every process still running, each waited for up to ``grace`` seconds in
        all; those still running then are killed with all they started. Returns their names."""
        self.stopping = True
        for child in self.children.values():
            child.restart_at = None
            if child.process is not None and child.process.poll() is None:
                child.process.terminate()
        deadline = self.clock() + grace
        killed = []
        for child in self.children.values():
            if child.process is None:
                continue
            try:
                child.process.wait(timeout=max(0.1, deadline - self.clock()))
            except subprocess.TimeoutExpired:
                killed.append(child.name)
            self._kill_group(child.process)
            child.process.wait()
        for child in self.children.values():
            for pump in child.pumps:
                pump.join(5)
        for file in self._files.values():
            file.close()
        return killed

    def _start(self, child: Child) -> None:
        child.process = subprocess.Popen(
            child.command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the supervisor, which stops them in order
        )
        child.started = self.clock()
        again = f" again (restart {child.restarts})" if child.restarts else ""
        self._write(
            child, f"==== {time.strftime('%F %T')} started{again} (pid {child.process.pid}) ====\n"
        )
        self.say(f"{child.name} started{again} (pid {child.process.pid})")
        pump = threading.Thread(
            target=self._pump, args=(child, child.process), name=f"log-{child.name}", daemon=True
        )
        child.pumps = [p for p in child.pumps if p.is_alive()] + [pump]
        pump.start()

    def _pump(self, child: Child, process: subprocess.Popen) -> None:
        in_error = False
        for raw in process.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self._write(child, line + "\n")
            show, in_error = shown(line, in_error=in_error)
            if show:
                self.say(f"{child.name} | {line}")
        process.stdout.close()

    def _open_log(self, child: Child) -> None:
        """``NAME.log`` begun anew, the one there before kept as ``NAME.log.1``."""
        if child.log.exists():
            child.log.replace(child.log.with_name(f"{child.log.name}.1"))
        descriptor = os.open(child.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._files[child.name] = os.fdopen(descriptor, "a", encoding="utf-8")

    def _write(self, child: Child, text: str) -> None:
        with self._saying:
            file = self._files[child.name]
            if file.closed:
                return
            file.write(text)
            file.flush()
            if file.tell() >= self.log_bytes:
                file.close()
                self._open_log(child)

    @staticmethod
    def _kill_group(process: subprocess.Popen) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
