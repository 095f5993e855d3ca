"""`make bench`: `make run` left running (issue 49). The console on its embedded defaults
(SQLite, the filesystem broker: what a newcomer's `make run` starts) with a real agent joined
and serving, and a one-card job submitted every few seconds for half an hour: no process of
the console restarted, every job succeeded.

TUNEPLANE_BENCH_SOAK_SECONDS (default 1800) is how long jobs are submitted;
TUNEPLANE_BENCH_SOAK_EVERY (default 5) the seconds between two. It prints jobs submitted,
succeeded, submit-to-succeeded p50 and p99, and how large the worker's log grew.
"""

import json
import os
import statistics
import time
from pathlib import Path

import pytest

from tests.e2e.test_make_run import call
from tests.e2e.test_make_run_jobs import make_run_with_an_agent

pytestmark = [pytest.mark.bench]

SECONDS = float(os.environ.get("TUNEPLANE_BENCH_SOAK_SECONDS", 1800))
EVERY = float(os.environ.get("TUNEPLANE_BENCH_SOAK_EVERY", 5))
# After the last submission: time for the last jobs to run.
SETTLE_SECONDS = 300


def restarts(var: Path) -> list[str]:
    """The supervisor's lines, in the processes' logs, about a process that ended."""
    return [
        line
        for log in sorted((var / "log").glob("*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if line.startswith("==== ") and (" exited with " in line or " was killed by " in line)
    ]


def test_make_run_soaks_with_jobs_every_few_seconds_and_nothing_restarts_or_is_lost(tmp_path):
    database = f"sqlite:///{tmp_path / 'tuneplane.sqlite3'}"  # the embedded default's place
    with make_run_with_an_agent(tmp_path, database) as (base, token):

        def state(job_id):
            status, body = call("GET", f"{base}/api/training-jobs/{job_id}", token)
            assert status == 200, body
            return json.loads(body)["state"]

        submitted: dict[int, float] = {}  # job id -> when the API answered
        done: dict[int, float] = {}  # job id -> when it was first seen succeeded
        ended: dict[int, str] = {}  # job id -> an end that is not success

        def look():
            for job_id in [j for j in submitted if j not in done and j not in ended]:
                now = state(job_id)
                if now == "succeeded":
                    done[job_id] = time.monotonic()
                elif now in {"failed", "cancelled"}:
                    ended[job_id] = now

        started = time.monotonic()
        number = 0
        while time.monotonic() - started < SECONDS:
            number += 1
            status, body = call(
                "POST",
                f"{base}/api/training-jobs",
                token,
                {"project": "ml", "name": f"soak-{number}", "cards": 1, "script": "echo soak"},
            )
            assert status == 201, body
            submitted[json.loads(body)["id"]] = time.monotonic()
            assert not restarts(tmp_path), restarts(tmp_path)
            while time.monotonic() - submitted[max(submitted)] < EVERY:
                look()  # every half second: the latencies are read to half a second
                time.sleep(0.5)
        deadline = time.monotonic() + SETTLE_SECONDS
        while len(done) + len(ended) < len(submitted) and time.monotonic() < deadline:
            look()
            time.sleep(0.5)
        lost = {j: state(j) for j in submitted if j not in done}

    latencies = sorted(done[j] - submitted[j] for j in done)
    worker_log = tmp_path / "log" / "worker.log"
    print(
        f"\nsoak: `make run` (SQLite, filesystem broker) + 1 agent, {SECONDS:.0f} s, a job every "
        f"{EVERY:.0f} s: {len(submitted)} submitted, {len(done)} succeeded, "
        f"{len(lost)} not ({sorted(set(lost.values()))}); submit to succeeded p50 "
        f"{statistics.median(latencies):.1f} s, p99 "
        f"{latencies[int(0.99 * (len(latencies) - 1))]:.1f} s; worker.log "
        f"{worker_log.stat().st_size / 1e6:.1f} MB; restarts: {len(restarts(tmp_path))}"
    )
    assert not restarts(tmp_path), restarts(tmp_path)
    assert not lost, lost
