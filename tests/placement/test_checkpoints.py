"""H4: a checkpoint is a signal the console hears. A member marks a checkpoint by changing its
mark file (``$TUNEPLANE_CHECKPOINT_MARK``); its node notes when (its own clock) and reports
it; the console keeps the latest, never an earlier one, never later than its own now. Q5 then
takes, of victims otherwise alike, the one that ran least since its last checkpoint; and an
attempt that ended without succeeding reports what it lost as the time since its last
checkpoint."""

import dataclasses
import math
from datetime import UTC, datetime, timedelta

import pytest

from nodes.models import NodeCommand
from nodes.services.commands import checkpoint_time
from placement.faults import work_lost
from placement.models import Member
from placement.preemption import victims
from placement.services.allocator import allocate
from tests.placement.test_decide import request
from tests.placement.test_preemption import MIN_RUNTIME, NOW, full, reclaim_book, running
from tests.placement.test_quotas import submit
from tests.placement.test_running_rules import report

A, B = 1, 2


@pytest.mark.parametrize("first", ["old", "young"])
def test_H4_Q5_of_two_victims_the_one_that_ran_least_since_its_checkpoint_is_taken(first):
    """Both borrowed, same project, priority and cards. The old one (50,000 s) marked a
    checkpoint 100 s ago; the young one (700 s) never did: preempting the old one loses
    100 s of work, the young one 700 s — the old one is taken, whichever comes first."""
    old = dataclasses.replace(
        running(1, A, "n", 8, ran=50_000), checkpointed_at=NOW - timedelta(seconds=100)
    )
    young = running(2, A, "m", 8, ran=700)
    pool = [old, young] if first == "old" else [young, old]
    waiter, book = request(9, cards=8, project=B), reclaim_book(held_a=16)
    assert victims(waiter, pool, full("n", "m"), book, NOW, MIN_RUNTIME) == [old]


@pytest.mark.parametrize("ago", [800, 701])
def test_H4_Q5_a_checkpoint_older_than_the_other_jobs_start_does_not_save_it(ago):
    """The old job's checkpoint is older than the young job's whole run (the boundary: 701
    s against 700 s): it still loses more, so the young one is taken."""
    old = dataclasses.replace(
        running(1, A, "n", 8, ran=50_000), checkpointed_at=NOW - timedelta(seconds=ago)
    )
    young = running(2, A, "m", 8, ran=700)
    taken = victims(
        request(9, cards=8, project=B),
        [old, young],
        full("n", "m"),
        reclaim_book(held_a=16),
        NOW,
        MIN_RUNTIME,
    )
    assert taken == [young]


def test_H4_a_checkpoint_from_before_the_attempt_started_counts_for_nothing():
    job = running(1, A, "n", 8, ran=900)
    earlier = dataclasses.replace(job, checkpointed_at=job.started_at - timedelta(seconds=5))
    assert earlier.kept_until == job.started_at
    later = dataclasses.replace(job, checkpointed_at=job.started_at + timedelta(seconds=5))
    assert later.kept_until == job.started_at + timedelta(seconds=5)
    assert job.kept_until == job.started_at  # none: its start


T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("state", "checkpoints", "ended", "lost"),
    [
        ("failed", [], 600, 600.0),  # none: since its start
        ("lost", [T0 + timedelta(seconds=500)], 600, 100.0),
        ("failed", [T0 + timedelta(seconds=200), T0 + timedelta(seconds=500), None], 600, 100.0),
        ("preempted", [T0 - timedelta(seconds=50)], 600, 600.0),  # before its start: none
        ("failed", [T0 + timedelta(seconds=600)], 600, 0.0),  # marked as it ended
        ("succeeded", [], 600, None),  # nothing lost
        ("running", [], None, None),
    ],
)
def test_H4_an_attempt_reports_the_work_it_lost_as_the_time_since_its_last_checkpoint(
    state, checkpoints, ended, lost
):
    ended_at = None if ended is None else T0 + timedelta(seconds=ended)
    assert work_lost(state, T0, checkpoints, ended_at) == lost
    assert work_lost(state, None, checkpoints, ended_at) is None  # never started


def test_H4_a_nodes_checkpoint_time_is_never_later_than_the_consoles_now():
    now = T0
    assert checkpoint_time(0.0, now) is None
    assert checkpoint_time(-1.0, now) is None
    assert checkpoint_time(math.nan, now) is None and checkpoint_time(math.inf, now) is None
    assert checkpoint_time(1e300, now) is None or checkpoint_time(1e300, now) == now
    assert checkpoint_time((now - timedelta(seconds=30)).timestamp(), now) == now - timedelta(
        seconds=30
    )
    assert checkpoint_time((now + timedelta(hours=1)).timestamp(), now) == now  # a fast clock


def test_H4_a_reported_checkpoint_reaches_the_member_and_only_ever_moves_later(
    node_fleet, gpu_node, member, member_api
):
    gpu_node(node_fleet)
    job = submit(member, "ml", "train", cards=8)
    allocate(fleet_id=node_fleet.id)
    [placed] = Member.objects.filter(attempt__training_job=job)
    report(placed)
    placed.refresh_from_db()
    assert placed.checkpointed_at is None
    marked = datetime.now(UTC) - timedelta(seconds=30)
    report(placed, checkpoint_at=marked)
    placed.refresh_from_db()
    assert placed.checkpointed_at == marked
    report(placed, checkpoint_at=marked - timedelta(seconds=10))  # an older report, late
    placed.refresh_from_db()
    assert placed.checkpointed_at == marked
    assert NodeCommand.objects.get(pk=placed.command_id).checkpointed_at == marked
    shown = member_api.get(f"/api/training-jobs/{job.pk}").json()["attempts"][0]
    assert shown["members"][0]["checkpointed_at"] is not None
    assert shown["work_lost_seconds"] is None  # still running
    report(placed, "failed", exit_code=1, reason="exit", checkpoint_at=marked)
    shown = member_api.get(f"/api/training-jobs/{job.pk}").json()["attempts"][0]
    assert 0 <= shown["work_lost_seconds"] < 120  # since the mark, not since its start
