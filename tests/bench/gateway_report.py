"""`make bench`'s gateway figures as printed: the table of tests/bench/test_bench_gateway.py,
the gateway beside a bare grpc.aio echo server, and the garbage collections its /metrics
counted."""

import signal
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scraped(metrics: str) -> str:
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as response:
        return response.read().decode()


def opens_refused(metrics: str) -> dict[str, int]:
    """The streams the gateway ended before their Welcome, by why (its /metrics)."""
    return {
        sample.labels["reason"]: int(sample.value)
        for family in text_string_to_metric_families(scraped(metrics))
        if family.name == "tuneplane_gateway_opens_refused"
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def gc_pauses(metrics: str) -> dict:
    """The gateway's garbage collections (its /metrics): how many by generation, and how many
    of them paused it for more than 100 ms."""
    text = scraped(metrics)
    counts, short, blocks, trims = {}, {}, 0, {"count": 0, "seconds": 0, "released": 0}
    for family in text_string_to_metric_families(text):
        if family.name == "tuneplane_gateway_python_allocated_blocks":
            blocks = int(family.samples[0].value)
        for sample in family.samples:
            if sample.name == "tuneplane_gateway_malloc_trim_seconds_count":
                trims["count"] = int(sample.value)
            elif sample.name == "tuneplane_gateway_malloc_trim_seconds_sum":
                trims["seconds"] = sample.value
            elif sample.name == "tuneplane_gateway_malloc_trim_released_bytes_total":
                trims["released"] = int(sample.value)
        if family.name != "tuneplane_gateway_gc_pause_seconds":
            continue
        for sample in family.samples:
            generation = sample.labels["generation"]
            if sample.name.endswith("_count"):
                counts[generation] = int(sample.value)
            elif sample.name.endswith("_bucket") and float(sample.labels["le"]) == 0.1:
                short[generation] = int(sample.value)
    return {
        "gc_collections": counts,
        "gc_pauses_over_100ms": {g: counts[g] - short.get(g, 0) for g in counts},
        "python_blocks": {"all": blocks},
        "malloc_trim": trims,
    }


def malloc_trims(f: dict) -> str:
    trims = (f.get("window_gc") or {}).get("malloc_trim")
    if not trims or not trims["count"]:
        return "not measured"
    return (
        f"{trims['count']} trims, {trims['released'] / 2**20:.0f} MiB handed back, "
        f"{1000 * trims['seconds'] / trims['count']:.1f} ms each on average"
    )


def resident_kinds(f: dict) -> str:
    """Which part of the RSS moved over the window (tests/bench/resident.py)."""
    start, end = f["server_resident_window"]
    return (
        ", ".join(
            f"{kind} {start[kind]:.0f} / {end[kind]:.0f}"
            for kind in ("main heap", "thread heaps", "other anonymous")
        )
        + f" MiB ({end['thread heap count']} thread heaps)"
    )


def acks_per_cpu_second(f: dict) -> float:
    """Closed-loop acks per second of server CPU: the generator shares this machine's two
    cores, so the raw maximum is partly the generator's; this is the server's own cost."""
    return f["saturation_heartbeats_per_second"] / (f["saturation_server_cpu_percent"] / 100)


def ms(f: dict, prefix: str = "") -> str:
    values = [f[prefix + key] for key in ("p50_ms", "p99_ms", "max_ms")]
    return "no acks" if None in values else " / ".join(f"{v:.1f}" for v in values) + " ms"


def stop(f: dict) -> str:
    code = f["returncode"]
    how = "" if code == 0 else " (killed)" if code == -signal.SIGKILL else f" (exit {code})"
    closed = f", {f['sessions_closed']} sessions closed" if "sessions_closed" in f else ""
    return f"{f['stop_seconds']} s{how}{closed}"


def gc_shown(f: dict) -> str:
    return " ".join(
        f"{g}:{n}({f['gc_pauses_over_100ms'][g]})" for g, n in sorted(f["gc_collections"].items())
    )


def rows(interval: float, saturate: float) -> list:
    return [
        (
            "streams held / still open at the end",
            lambda f: f"{f['streams_held']}/{f['streams_requested']} / {f['streams_open_at_end']}",
        ),
        (
            "all Welcomed after",
            lambda f: f"{f['ramp_seconds']:.1f} s ({f['streams_held'] / f['ramp_seconds']:.0f}"
            f" streams/s)",
        ),
        ("  open p50 / p99", lambda f: f"{f['open_p50_ms']:.0f} / {f['open_p99_ms']:.0f} ms"),
        (
            "  opens tried again (the agent's backoff)",
            lambda f: f"{sum(f['open_retries'].values())} {f['open_retries'] or ''}".strip(),
        ),
        (
            "  of them refused by the server, by why",
            lambda f: str(f["opens_refused"] or 0) if "opens_refused" in f else "not measured",
        ),
        (
            "  a failed open had run for, p50 / max",
            lambda f: f"{f['open_failed_after_p50_ms'] / 1000:.1f} / "
            f"{f['open_failed_after_max_ms'] / 1000:.1f} s"
            if f.get("open_failed_after_p50_ms") is not None
            else "none failed",
        ),
        (
            f"heartbeats/s, each stream every {interval} s",
            lambda f: f"{f['heartbeats_per_second']:.1f}",
        ),
        ("  ack p50 / p99 / max", ms),
        (
            "  GC in it by generation (> 100 ms)",
            lambda f: gc_shown(f["window_gc"]) if f.get("window_gc") else "not measured",
        ),
        ("  server CPU (% of one core)", lambda f: f"{f['server_cpu_percent']:.0f} %"),
        ("  generator CPU", lambda f: f"{f['client_cpu_percent']:.0f} %"),
        ("  DB commits/s (xact_commit)", lambda f: f"{f['db_commits_per_second']:.2f}"),
        ("  DB connections opened/s", lambda f: f"{f['db_connections_per_second']:.2f}"),
        ("  DB rows written/s", lambda f: f"{f['db_rows_written_per_second']:.0f}"),
        (
            f"max heartbeats/s (closed loop, {saturate} s)",
            lambda f: f"{f['saturation_heartbeats_per_second']:.0f}",
        ),
        ("  ack p50 / p99 / max", lambda f: ms(f, "saturation_")),
        (
            "  server / generator CPU",
            lambda f: f"{f['saturation_server_cpu_percent']:.0f} % / "
            f"{f['saturation_client_cpu_percent']:.0f} %",
        ),
        ("  acks per server CPU-second", lambda f: f"{acks_per_cpu_second(f):.0f}"),
        (
            "server peak RSS (VmHWM)",
            lambda f: f"{f['server_peak_rss_mb']:.0f} MiB "
            f"(+{f['server_rss_per_stream_kb']:.0f} KiB/stream)",
        ),
        (
            "  Python allocator blocks, growth in it",
            lambda f: f"{f['window_gc']['python_blocks']['all']:+,}"
            if f.get("window_gc")
            else "not measured",
        ),
        ("  malloc_trim in the steady window", malloc_trims),
        (
            "  RSS growth over the steady window",
            lambda f: f"{f['server_rss_slope_mb_per_hour']:+.1f} MiB/hour "
            f"({f['server_rss_window_mb'][0]:.0f} to {f['server_rss_window_mb'][1]:.0f} MiB); "
            f"its second half {f['server_rss_slope_late_mb_per_hour']:+.1f}",
        ),
        ("  resident at the window's start / end", resident_kinds),
        ("server stop after the generator left", stop),
        (
            "GC collections by generation (> 100 ms)",
            lambda f: " ".join(
                f"{g}:{n}({f['gc_pauses_over_100ms'][g]})" for g, n in f["gc_collections"].items()
            )
            if "gc_collections" in f
            else "not measured",
        ),
        ("errors", lambda f: f"{f['errors']} {f['error_kinds'] or ''}".strip()),
    ]


def report(gateway: dict, echo: dict, interval: float, saturate: float, window: float) -> str:
    table = rows(interval, saturate)
    label_width = max(len(label) for label, _ in table) + 2
    column = max(len(show(gateway)) for _, show in table) + 3
    lines = [
        f"\nbench gateway: N={gateway['streams_requested']} streams, "
        + (
            f"{gateway['ramp_concurrency']} opens in flight"
            if gateway["ramp_concurrency"]
            else f"all arriving within {gateway['arrive_within_seconds']:g} s"
        )
        + f", {window} s steady window",
        f"{'':{label_width}}{'grpcserve (PostgreSQL)':{column}}bare grpc.aio echo",
    ]
    lines += [f"{label:{label_width}}{show(gateway):{column}}{show(echo)}" for label, show in table]

    def ratio(key):
        return gateway[key] / echo[key]

    lines.append(
        f"gateway/echo: heartbeats/s at the interval {ratio('heartbeats_per_second'):.2f} "
        f"(both ack all there is); streams Welcomed/s "
        f"{echo['ramp_seconds'] / gateway['ramp_seconds']:.2f}; max heartbeats/s "
        f"{ratio('saturation_heartbeats_per_second'):.2f}; acks per server CPU-second "
        f"{acks_per_cpu_second(gateway) / acks_per_cpu_second(echo):.2f}"
    )
    return "\n".join(lines)
