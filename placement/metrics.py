"""Placement's figures for Prometheus: admissions and refusals by reason with their latency,
the allocator's passes and how long jobs waited for cards, counted as they happen; and the
queue, read from the database at each scrape of the web's /metrics."""

import contextlib
import contextvars
import functools
import time

from django.db.models import Count
from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from tuneplane.errors import NotFound, PlacementRefused

from .choices import JobState
from .models import LifecycleJob, TrainingJob

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
