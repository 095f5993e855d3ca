"""Placement's figures for Prometheus: admissions and refusals by reason with their latency,
the allocator's passes and how long jobs waited for cards, counted as they happen; and, read
from the database at each scrape of the web's /metrics, the queue, what waits by its reason
to wait (Q8), and each Fleet's cards by hardware series, held and free."""

import contextlib
import contextvars
import functools
import time

from django.db.models import Count
from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from nodes.choices import SchedulingState
from nodes.models import Node
from tuneplane.errors import NotFound, PlacementRefused

from .choices import DeploymentState, EpisodeState, JobState, RevisionState
from .models import (
    CardHold,
    Episode,
    LifecycleJob,
    PlaygroundSession,
    Revision,
    TrainingJob,
)
from .services.waiting import SESSION_WAITS

ADMISSIONS = Counter(
    "tuneplane_admissions",
    "Admission decisions: admitted, or refused by reason (not_found: a Fleet the project "
    "cannot see or that does not exist).",
    ["outcome", "reason"],
)
ADMISSION_LATENCY = Histogram(
    "tuneplane_admission_seconds",
    "One admission decision, gates and inventory fit included.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
ALLOCATION_WAIT = Histogram(
    "tuneplane_allocation_wait_seconds",
    "From a job's admission to the allocator holding its cards.",
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
)
ALLOCATOR_PASS = Histogram("tuneplane_allocator_pass_seconds", "One allocator pass over a Fleet.")

_deciding = contextvars.ContextVar("tuneplane_admission_deciding", default=False)
# A dry run (Q7) admits and allocates only to answer, then rolls back: it is not counted.
_dry_run = contextvars.ContextVar("tuneplane_dry_run", default=False)


@contextlib.contextmanager
def not_counted():
    """Admissions and allocator passes inside are a dry run's: not counted or timed."""
    token = _dry_run.set(True)
    try:
        yield
    finally:
        _dry_run.reset(token)


def counted() -> bool:
    return not _dry_run.get()


def measured_admission(admit):
    """Counts and times one admission, once, however its gates call one another."""

    @functools.wraps(admit)
    def measured(*args, **kwargs):
        if _deciding.get() or not counted():
            return admit(*args, **kwargs)
        token = _deciding.set(True)
        started = time.perf_counter()
        try:
            admitted = admit(*args, **kwargs)
        except PlacementRefused as refusal:
            ADMISSIONS.labels("refused", refusal.reason).inc()
            raise
        except NotFound:
            ADMISSIONS.labels("refused", "not_found").inc()
            raise
        finally:
            ADMISSION_LATENCY.observe(time.perf_counter() - started)
            _deciding.reset(token)
        ADMISSIONS.labels("admitted", "").inc()
        return admitted

    return measured


class QueueCollector:
    def collect(self):
        queued = GaugeMetricFamily(
            "tuneplane_allocator_queue_length",
            "Jobs admitted to a node Fleet and waiting for cards.",
            labels=["fleet"],
        )
        counts: dict[str, int] = {}
        for model in (TrainingJob, LifecycleJob):
            for row in (
                model.objects.filter(state=JobState.QUEUED, fleet__isnull=False)
                .values("fleet_id")
                .annotate(n=Count("id"))
            ):
                counts[row["fleet_id"]] = counts.get(row["fleet_id"], 0) + row["n"]
        for fleet_id, count in sorted(counts.items()):
            queued.add_metric([fleet_id], count)
        yield queued


class WaitingCollector:
    """Q8 across a Fleet: what waits, by kind and by the reason its last pass gave (what no
    pass has looked at yet is left out); and R1's cards by hardware series, held and free.
    A query a kind, and two for the cards."""

    def collect(self):
        waiting = GaugeMetricFamily(
            "tuneplane_waiting",
            "Work waiting for cards on node Fleets, by kind and reason to wait (Q8).",
            labels=["fleet", "kind", "reason"],
        )
        counts: dict[tuple[str, str, str], int] = {}

        def count(fleet_id, kind, reason, n=1):
            if reason:
                key = (fleet_id, kind, reason)
                counts[key] = counts.get(key, 0) + n

        for kind, rows in (
            ("job", TrainingJob.objects.filter(state=JobState.QUEUED)),
            ("job", LifecycleJob.objects.filter(state=JobState.QUEUED)),
            ("session", PlaygroundSession.objects.filter(SESSION_WAITS)),
            ("episode", Episode.objects.filter(state=EpisodeState.QUEUED)),
        ):
            fleet = "environment__fleet_id" if kind == "episode" else "fleet_id"
            for row in rows.values(fleet, "waiting__reason").annotate(n=Count("id")):
                count(row[fleet], kind, row["waiting__reason"], row["n"])
        for fleet_id, by_rank in Revision.objects.filter(
            state=RevisionState.LIVE, deployment__state=DeploymentState.LIVE
        ).values_list("deployment__fleet_id", "waiting"):
            for wait in (by_rank or {}).values():
                count(fleet_id, "replica", wait.get("reason"))
        for labels, n in sorted(counts.items()):
            waiting.add_metric(list(labels), n)
        yield waiting
        yield _cards_by_series()


def _cards_by_series():
    """Each Fleet's healthy cards of each mapped series on its machines, held (from allocation
    until cleanup, R7) and free."""
    cards = GaugeMetricFamily(
        "tuneplane_gpu_cards_series",
        "Healthy cards of a Fleet's machines by hardware series: held by members, and free.",
        labels=["fleet", "series", "state"],
    )
    totals: dict[tuple[str, str], int] = {}
    for fleet_id, per_series in (
        Node.objects.filter(fleet__isnull=False)
        .exclude(scheduling_state=SchedulingState.REMOVED)
        .values_list("fleet_id", "series_cards")
    ):
        for series, n in (per_series or {}).items():
            totals[(fleet_id, series)] = totals.get((fleet_id, series), 0) + n
    held = {
        (row["node__fleet_id"], row["series"]): row["n"]
        for row in CardHold.objects.exclude(series="")
        .values("node__fleet_id", "series")
        .annotate(n=Count("id"))
    }
    for (fleet_id, series), total in sorted(totals.items()):
        taken = held.get((fleet_id, series), 0)
        cards.add_metric([fleet_id, series, "held"], taken)
        cards.add_metric([fleet_id, series, "free"], max(total - taken, 0))
    return cards
