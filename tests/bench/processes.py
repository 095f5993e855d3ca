"""The processes the gateway benches start beside the console under test: a Celery worker
and beat sweeping liveness, and ``reconnecting_load``'s simulated fleet."""

import json
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from tests.e2e.console import ROOT
from tuneplane.schedule import seed_schedule

FLEET_STOP_TIMEOUT_SECONDS = 120


def celery(*args, env: dict, log: Path) -> subprocess.Popen:
    """Output to a file: a worker logging every second's sweep would fill a pipe and stall."""
    with log.open("w") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tuneplane", *args],
            env=env,
            cwd=ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
        )


@contextmanager
def sweepers(env: dict, directory: Path):
    """A Celery worker and beat, sweeping liveness as ``env`` says; yields the worker's log."""
    seed_schedule()
    log = directory / "worker.log"
    worker = celery("worker", "-l", "INFO", "--pool", "solo", env=env, log=log)
    beat = celery(
        "beat",
        "-l",
        "INFO",
        "-s",
        str(directory / "beat-schedule"),
        env=env,
        log=directory / "beat.log",
    )
    try:
        yield log
    finally:
        for process in (beat, worker):
            process.terminate()
            process.wait(30)


def sweeps_run(log: Path) -> int:
    return sum(
        "nodes.liveness_sweep" in line and "succeeded" in line
        for line in log.read_text().splitlines()
    )


class ReconnectingFleet:
    """The simulated nodes, as a subprocess whose progress goes to ``fleet.log``."""

    def __init__(self, targets: list[str], credentials: Path, directory: Path, nodes: int):
        self.log = directory / "fleet.log"
        with self.log.open("w") as stderr:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.bench.reconnecting_load",
                    "--credentials",
                    str(credentials),
                    "--nodes",
                    str(nodes),
                    *[option for target in targets for option in ("--target", target)],
                ],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )

    def running(self) -> bool:
        """For waits: a fleet that died fails them at once, with its last words."""
        assert self.process.poll() is None, self.log.read_text()[-4000:]
        return True

    def stop(self) -> dict:
        """SIGTERM: the nodes close their streams; their figures, as JSON."""
        self.process.send_signal(signal.SIGTERM)
        out = self.process.communicate(timeout=FLEET_STOP_TIMEOUT_SECONDS)[0]
        assert self.process.returncode == 0, self.log.read_text()[-4000:]
        return json.loads(out.strip().splitlines()[-1])


@contextmanager
def reconnecting_fleet(targets: list[str], credentials: Path, directory: Path, nodes: int):
    fleet = ReconnectingFleet(targets, credentials, directory, nodes)
    try:
        yield fleet
    finally:
        if fleet.process.returncode is None:
            fleet.process.kill()
            fleet.process.wait()
