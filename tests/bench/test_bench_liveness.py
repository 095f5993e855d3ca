"""`make bench`: the liveness sweep over 10,000 and 100,000 nodes with 1 % stale, beside the
bare SQL UPDATE that makes the same gone transition, in the same process and database.

Not a timed test: it prints figures. Each run is rolled back, so every repetition sweeps
the same rows; the median of several is reported.
"""

import statistics
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from nodes.choices import SchedulingState
from nodes.models import Node
from nodes.services.liveness import liveness_sweep

pytestmark = [pytest.mark.bench, pytest.mark.postgres]

REPEAT = 5
BARE = (
    "UPDATE nodes_node SET scheduling_state = 'gone' WHERE fleet_id = ANY(%s) "
    "AND scheduling_state IN ('enrolled', 'schedulable', 'draining') AND last_seen_at < %s"
)


def _nodes(fleet, count: int) -> None:
    now = timezone.now()
    stale = now - timedelta(seconds=400)
    Node.objects.bulk_create(
        (
            Node(
                id=f"n-{fleet.id}-{i:06d}",
                fleet=fleet,
                hostname=f"h{i}",
                scheduling_state=SchedulingState.SCHEDULABLE,
                last_seen_at=stale if i % 100 == 0 else now,
                inventory_observed_at=now,
            )
            for i in range(count)
        ),
        batch_size=5000,
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE nodes_node")


def _median_ms(run) -> tuple[float, object]:
    timings, result = [], None
    for _ in range(REPEAT):
        with transaction.atomic():
            started = time.perf_counter()
            result = run()
            timings.append((time.perf_counter() - started) * 1000)
            transaction.set_rollback(True)
    return statistics.median(timings), result


def _bare(fleet_ids):
    def run():
        with connection.cursor() as cursor:
            cursor.execute(BARE, [fleet_ids, timezone.now() - timedelta(seconds=300)])
            return cursor.rowcount

    return run


@pytest.mark.parametrize("count", [10_000, 100_000])
@pytest.mark.parametrize("capabilities", [["train"], ["train", "serve", "env"]])
def test_bench_liveness_sweep(make_fleet, count, capabilities, capsys):
    if connection.vendor != "postgresql":
        pytest.skip("benchmarked on PostgreSQL")
    fleet = make_fleet("gpu", kind="node", capabilities=capabilities)
    _nodes(fleet, count)
    bare_ms, bare_rows = _median_ms(_bare([fleet.id]))
    sweep_ms, changed = _median_ms(liveness_sweep)
    assert changed["gone"] == bare_rows == count // 100
    with capsys.disabled():
        print(
            f"\nbench liveness sweep, {count:,} nodes ({'+'.join(capabilities)}), 1 % stale: "
            f"sweep {sweep_ms:.1f} ms (transitions: "
            f"{', '.join(f'{k} {v}' for k, v in changed.items() if v)}; audited), "
            f"bare UPDATE {bare_ms:.1f} ms, ratio {sweep_ms / bare_ms:.2f}"
        )
