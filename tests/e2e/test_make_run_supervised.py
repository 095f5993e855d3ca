"""`make run` keeps its processes running (issue 49): on its embedded defaults (SQLite, the
filesystem broker), the Celery worker killed with SIGKILL is started again, with one line on
the terminal saying which process, how it ended and when it comes back, and tasks run on the
new one; the terminal shows the banner, the processes' starts and their warnings, while
their INFO lines go to var/log/."""

import os
import re
import signal
import stat
import time
import uuid
from pathlib import Path

import pytest

from .console import Console, console_env, free_port, processes_with_env

SUCCEEDED = re.compile(r"Task nodes\.liveness_sweep\[[\w-]+\] succeeded")


def wait_until(check, timeout=90.0, what="it"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def children_of(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@pytest.fixture(scope="module")
def make_run(tmp_path_factory):
    """`make run` as a newcomer starts it: no DATABASE_URL, no REDIS_URL; sweeps every second
    so that beat and the worker have work to show."""
    var = tmp_path_factory.mktemp("make-run")
    marker = f"tuneplane-e2e-{uuid.uuid4().hex}"
    env = console_env(var, TUNEPLANE_SWEEP_INTERVAL="1", TUNEPLANE_E2E_MARKER=marker)
    env.pop("DATABASE_URL")
    env.pop("REDIS_URL", None)
    console = Console(env, free_port())
    try:
        console.wait_for("Tuneplane console is up", timeout=240)
        yield console, var
    finally:
        code = console.stop()
        assert code == 0, console.output[-3000:]
        assert "Stopped." in console.output
        assert processes_with_env(marker) == [], "a process outlived Ctrl-C"


def test_the_terminal_stays_quiet_and_the_workers_log_gets_its_info_lines(make_run):
    console, var = make_run
    worker_log = var / "log" / "worker.log"
    wait_until(lambda: len(SUCCEEDED.findall(worker_log.read_text())) >= 3, what="3 sweeps")
    time.sleep(3)
    logged = worker_log.read_text()
    assert "INFO/MainProcess" in logged and "INFO/ForkPoolWorker" in logged
    # The terminal: the banner, one line per process start, warnings and errors; no INFO.
    terminal = console.output
    assert not re.search(r"[\s:]INFO[/\s]", terminal), terminal[-3000:]
    assert "celery@" not in terminal and "Starting development server" not in terminal
    for name in ("web", "gateway", "worker", "beat"):
        assert len(re.findall(rf"\d\d:\d\d:\d\d {name} started \(pid \d+\)", terminal)) == 1
        log = var / "log" / f"{name}.log"
        assert stat.S_IMODE(log.stat().st_mode) == 0o600, log  # R23
    assert stat.S_IMODE((var / "log").stat().st_mode) == 0o700
    assert f"{var / 'log'}/{{web,gateway,worker,beat}}.log" in terminal  # the banner says where
    assert "gateway serving NodeControl" in (var / "log" / "gateway.log").read_text()


def test_a_killed_worker_is_started_again_and_the_console_says_why(make_run):
    console, var = make_run
    worker = int(re.search(r"worker started \(pid (\d+)\)", console.output).group(1))
    pool = wait_until(lambda: children_of(worker), what="the worker's pool")
    beat = int(re.search(r"beat started \(pid (\d+)\)", console.output).group(1))

    os.kill(worker, signal.SIGKILL)

    console.wait_for(f"worker (pid {worker}) was killed by SIGKILL")
    said = next(line for line in console.lines if f"worker (pid {worker})" in line)
    assert re.search(
        r"^\d\d:\d\d:\d\d worker \(pid \d+\) was killed by SIGKILL after \S+ up; "
        r"restarting in 1s, at \d\d:\d\d:\d\d \(its log: .*worker\.log\)$",
        said.rstrip("\n"),
    ), said
    console.wait_for("worker started again (restart 1) (pid ", timeout=30)
    new = int(re.search(r"worker started again \(restart 1\) \(pid (\d+)\)", console.output)[1])
    assert new != worker and alive(new)
    assert not any(alive(pid) for pid in pool), "the dead worker's pool outlived it"

    # Tasks run on the new worker: beat's sweeps succeed after its start in the log.
    worker_log = var / "log" / "worker.log"

    def swept_since_restart():
        text = worker_log.read_text()
        return SUCCEEDED.findall(text.split(f"started again (restart 1) (pid {new})")[-1])

    wait_until(swept_since_restart, what="a sweep on the new worker")
    # Nothing else was touched, and the console went on.
    assert alive(beat) and console.process.poll() is None
    assert console.output.count("restarting in") == 1
