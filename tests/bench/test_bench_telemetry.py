"""`make bench`: what telemetry costs the gateway, beside what heartbeats cost it (issue 19).

One ``grpcserve`` on PostgreSQL, loaded by ``tests/bench/telemetry_load.py`` with N streams
through four windows of equal length: quiet, heartbeats only, telemetry only (a sample of
eight cards per stream per interval, every one sent) and telemetry reported (the agent's
Reporter over a synthetic workload, at compressed time: what agents send). The gateway's
CPU in a window less the quiet one's, per message, is that message's cost in µs; the
database's commits per second in the telemetry window say whether its writes grow with N
(batched: they should not). Printed for each N of ``TUNEPLANE_BENCH_TELEMETRY_STREAMS``
(default ``500,2000``), with the projection to production rates — a heartbeat every 10 s, a
sample taken every 15 s — for every sample sent (the worst case: every node's figures moving
beyond a deadband all the time) and for the samples the Reporter sent (the gateway's CPU in
that window over the samples taken, sent or not).

Not a timed test: it asserts only that every sample sent reached the database.
"""

import json
import os
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nodes.models import NodeTelemetry
from tests.e2e.console import ROOT, console_env, free_port

from .test_bench_gateway import Sampler, enroll, serving

pytestmark = [pytest.mark.bench, pytest.mark.django_db(transaction=True)]

INTERVAL_SECONDS = 2.0
WINDOW_SECONDS = float(os.environ.get("TUNEPLANE_BENCH_TELEMETRY_WINDOW", "20"))
HEARTBEAT_EVERY, SAMPLE_EVERY = 10, 15  # production's: TUNEPLANE_HEARTBEAT/TELEMETRY_INTERVAL


def scrape(target: str) -> dict:
    """The gateway's own counters: {name: {label value or "": value}}."""
    with urllib.request.urlopen(f"http://{target}/metrics", timeout=10) as response:
        text = response.read().decode()
    figures: dict = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = next(iter(sample.labels.values()), "")
            figures.setdefault(sample.name, {})[key] = sample.value
    return figures


def stream_counts() -> list[int]:
    return [
        int(n) for n in os.environ.get("TUNEPLANE_BENCH_TELEMETRY_STREAMS", "500,2000").split(",")
    ]


def costs(sampler: Sampler, windows: dict) -> dict:
    span = {name: [w["start"], w["end"]] for name, w in windows.items()}
    idle = sampler.rate("cpu", span["quiet"])
    figures = {"idle_cpu_percent": 100 * idle}
    for name in ("heartbeats", "telemetry", "reported"):
        window = windows[name]
        seconds = window["end"] - window["start"]
        busy = sampler.rate("cpu", span[name]) - idle
        figures[f"{name}_per_second"] = window["messages"] / seconds
        figures[f"{name}_us"] = 1e6 * busy * seconds / max(window["messages"], 1)
        figures[f"{name}_cpu_percent"] = 100 * busy
        figures[f"{name}_db_commits_per_second"] = sampler.rate("commits", span[name])
        figures[f"{name}_db_rows_per_second"] = sampler.rate("rows_written", span[name])
    reported = windows["reported"]
    figures["sent_fraction"] = reported["messages"] / max(reported["samples"], 1)
    # The gateway's CPU per sample taken, whether the Reporter sent it or not.
    figures["reported_per_taken_us"] = figures["reported_us"] * figures["sent_fraction"]
    # At production rates, per node: heartbeat cost / 10 s against sample cost / 15 s.
    beat = figures["heartbeats_us"] / HEARTBEAT_EVERY
    figures["added_percent"] = 100 * (figures["telemetry_us"] / SAMPLE_EVERY) / beat
    figures["reported_added_percent"] = (
        100 * (figures["reported_per_taken_us"] / SAMPLE_EVERY) / beat
    )
    return figures


@pytest.mark.parametrize("streams", stream_counts())
def test_bench_telemetry_cost_beside_heartbeats(streams, node_fleet, console_pki, tmp_path, capsys):
    credentials = enroll(node_fleet, streams, tmp_path)
    target = f"127.0.0.1:{free_port()}"
    env = console_env(
        tmp_path,
        TUNEPLANE_PKI_DIR=str(console_pki),
        TUNEPLANE_DEBUG="0",
        TUNEPLANE_LOG_LEVEL="WARNING",
        # Telemetry alone renews no lease: the streams must outlive the telemetry window.
        TUNEPLANE_LEASE_TTL="600",
        TUNEPLANE_HEARTBEAT_INTERVAL="10",
        TUNEPLANE_TELEMETRY_FLUSH_INTERVAL="1",
    )
    metrics = f"127.0.0.1:{free_port()}"
    argv = [sys.executable, str(ROOT / "manage.py"), "grpcserve", "--bind", target]
    argv += ["--metrics-bind", metrics]
    with serving(argv, env, "gateway serving") as (process, _):
        sampler = Sampler(process.pid)
        sampler.start()
        try:
            done = subprocess.run(
                [
                    sys.executable, "-m", "tests.bench.telemetry_load",
                    "--target", target, "--credentials", str(credentials),
                    "--streams", str(streams), "--interval", str(INTERVAL_SECONDS),
                    "--window", str(WINDOW_SECONDS),
                ],
                cwd=ROOT, stdout=subprocess.PIPE, text=True, timeout=1800,
            )  # fmt: skip
        finally:
            sampler.done.set()
            sampler.join()
        flushes = scrape(metrics)
    assert done.returncode == 0, "the load generator failed: see its captured stderr"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    f = costs(sampler, result["windows"])
    reported = result["windows"]["reported"]
    stored = flushes["tuneplane_gateway_telemetry_samples_total"].get("stored", 0)
    flush_us = 1e6 * flushes["tuneplane_gateway_telemetry_flush_seconds_sum"][""] / max(stored, 1)
    with capsys.disabled():
        print(
            f"\nbench telemetry: N={streams} streams, each sending every {INTERVAL_SECONDS:g} s, "
            f"{WINDOW_SECONDS:g} s windows; gateway idle {f['idle_cpu_percent']:.1f} % CPU\n"
            f"  heartbeats: {f['heartbeats_per_second']:.0f}/s, "
            f"{f['heartbeats_us']:.0f} µs gateway CPU each, "
            f"DB {f['heartbeats_db_commits_per_second']:.2f} commits/s, "
            f"{f['heartbeats_db_rows_per_second']:.0f} rows/s\n"
            f"  telemetry (8 cards): {f['telemetry_per_second']:.0f}/s, "
            f"{f['telemetry_us']:.0f} µs gateway CPU each, of which its batched write "
            f"(read, check, judge health, upsert) {flush_us:.0f} µs wall per sample, "
            f"DB {f['telemetry_db_commits_per_second']:.2f} commits/s, "
            f"{f['telemetry_db_rows_per_second']:.0f} rows/s\n"
            f"  reported (the agent's Reporter, {100 * reported['swinging']:g} % of nodes "
            f"swinging, {reported['phase_changes_per_hour']:g} phase changes an hour): "
            f"{reported['messages']} sent of {reported['samples']} taken "
            f"({100 * f['sent_fraction']:.1f} %), {f['reported_us']:.0f} µs gateway CPU each "
            f"sent, {f['reported_per_taken_us']:.0f} µs per sample taken, "
            f"DB {f['reported_db_commits_per_second']:.2f} commits/s\n"
            f"  at production rates (beat every {HEARTBEAT_EVERY} s, sample every "
            f"{SAMPLE_EVERY} s) telemetry adds {f['reported_added_percent']:.1f} % to the "
            f"gateway's heartbeat CPU as reported; {f['added_percent']:.0f} % with every "
            f"sample sent (the worst case)"
        )
    assert NodeTelemetry.objects.count() == streams
