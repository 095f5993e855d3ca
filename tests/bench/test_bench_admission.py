"""`make bench`: admission with 100 Fleets and 10,000 placeable nodes.

Not a timed test: it prints p50/p99 of the admission decision and of a whole submission
(admission, the record, its audit event), and the queries each takes.
"""

import statistics
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.services import Actor
from nodes.choices import SchedulingState
from nodes.models import ControlSession, Node
from nodes.selectors import cards_summary
from placement.admission import Need, admit_automatically
from placement.services.submission import training_job_submit
from tests.conftest import H100_DEVICE_INVENTORY

pytestmark = [pytest.mark.bench]

FLEETS = int(__import__("os").environ.get("BENCH_FLEETS", 100))
NODES_PER_FLEET = int(__import__("os").environ.get("BENCH_NODES", 100))
RUNS = 200


def _placeable_fleets(make_fleet):
    now = timezone.now()
    lease = now + timedelta(hours=1)
    cards = cards_summary(H100_DEVICE_INVENTORY)  # as a join and an inventory report keep it
    for index in range(FLEETS):
        fleet = make_fleet(f"fleet-{index:03d}", kind="node", capabilities=["train", "serve"])
        nodes = Node.objects.bulk_create(
            [
                Node(
                    id=f"n-{index:03d}-{i:04d}",
                    fleet=fleet,
                    hostname=f"h{i}",
                    scheduling_state=SchedulingState.SCHEDULABLE,
                    inventory=H100_DEVICE_INVENTORY,
                    **cards,
                    inventory_observed_at=now,
                    last_seen_at=now,
                    lease_expires_at=lease,
                )
                for i in range(NODES_PER_FLEET)
            ]
        )
        ControlSession.objects.bulk_create(
            [
                ControlSession(
                    id=uuid.uuid4(),
                    node=node,
                    gateway="bench",
                    opened_at=now,
                    last_heartbeat_at=now,
                    lease_expires_at=lease,
                )
                for node in nodes
            ]
        )
    # Making them takes longer than the freshness window: observed now, as heartbeats would.
    Node.objects.update(inventory_observed_at=timezone.now())
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")


def _percentiles(samples):
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.99) - 1]


def test_bench_admission_100_fleets_10k_nodes(make_fleet, member, project, capsys):
    _placeable_fleets(make_fleet)
    need = Need("train", "h100", 8)
    decide, submit = [], []
    with CaptureQueriesContext(connection) as queries:
        admit_automatically(project, need)
    decision_queries = len(queries.captured_queries)
    for _ in range(RUNS):
        started = time.perf_counter()
        admitted = admit_automatically(project, need)
        decide.append((time.perf_counter() - started) * 1000)
    Node.objects.update(inventory_observed_at=timezone.now())
    for index in range(RUNS):
        started = time.perf_counter()
        training_job_submit(
            actor=Actor.of_user(member),
            project="ml",
            name=f"j{index}",
            series="h100",
            cards=8,
            command=["python", "train.py"],
        )
        submit.append((time.perf_counter() - started) * 1000)
    assert admitted.fleet_id == "fleet-000"
    with capsys.disabled():
        print(
            f"\nbench admission, {FLEETS} Fleets × {NODES_PER_FLEET} placeable nodes: "
            f"decision p50 {_percentiles(decide)[0]:.1f} ms, p99 {_percentiles(decide)[1]:.1f}"
            f" ms ({decision_queries} queries); whole submission p50 "
            f"{_percentiles(submit)[0]:.1f} ms, p99 {_percentiles(submit)[1]:.1f} ms"
        )
