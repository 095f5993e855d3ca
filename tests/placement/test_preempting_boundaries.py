"""What preemption's writer says and counts (placement.services.preempting) on the boundaries
a mutant moved (issue 47), without a database: a request named as its records name it
(Q7), why a victim was taken in the words its readers see (Q5, R23), the cards a victim
frees by their series on the node the pass sees (Q5), a preemptor's reason to wait with
its victims and the last deadline (Q8), the preemptor's audit event naming them (Q7).
Each test was seen failing against the mutants it
names."""

from datetime import UTC, datetime
from types import SimpleNamespace
from unittest.mock import call, patch

import pytest

from placement.decide import NodeCapacity, Request
from placement.models import LifecycleJob, TrainingJob
from placement.preemption import Running
from placement.services.preempting import (
    _preempting,
    _preemptors_record,
    _why,
    _with_series,
    named,
)
from placement.services.waiting import ALLOCATOR, Waiting
from placement.waits import Wait

START = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("key", "name"),
    [
        (("trainingjob", 7, 0), "trainingjob-7"),
        (("lifecyclejob", 7, 2), "lifecyclejob-7"),
        (("replica", 3, 1), "replica-3-1"),
    ],
)
def test_Q7_a_request_is_named_as_its_records_name_it(key, name):
    """x_named__mutmut_1–_6: a replica with its rank, a job without."""
    assert named(key) == name


def victim(project: int, priority: int = 0) -> Running:
    return Running(
        key=("trainingjob", 1),
        project=project,
        quota=(project, ""),
        borrowed=True,
        preemptible=False,
        priority=priority,
        started_at=START,
        members=(),
    )


def waiter(project: int, priority: int = 0) -> Request:
    return Request(
        key=("trainingjob", 2, 0), order=(START,), cards=8, project=project, priority=priority
    )


def test_Q5_R23_another_projects_victim_is_told_whose_guarantee_by_the_preemptors_slug():
    """x__why__mutmut_1–_3, _8–_11: the slug of the waiting job's project, read from its
    record; its id where the record has no project."""
    job = Waiting(owner=SimpleNamespace(project=SimpleNamespace(slug="cv")))
    assert _why(victim(1), waiter(2), job) == (
        "project cv waits for cards within its guarantee; this job ran on borrowed cards (rule Q5)"
    )
    bare = Waiting(owner=SimpleNamespace())
    assert _why(victim(1), waiter(2), bare).startswith("project 2 waits for cards")


def test_Q5_a_victim_of_its_own_project_is_told_the_priorities():
    """x__why__mutmut_10."""
    job = Waiting(owner=SimpleNamespace(project=SimpleNamespace(slug="ml")))
    assert _why(victim(1, priority=1), waiter(1, priority=5), job) == (
        "a job of its project with priority 5 waits; this one has priority 1 (rule Q5)"
    )


def test_Q5_a_victim_frees_its_healthy_cards_by_their_series_on_a_node_the_pass_sees():
    """x__with_series__mutmut_1–_9: each card with its series, one not listed (unhealthy)
    left out; on a node not placeable now, nothing."""
    node = NodeCapacity("n-1", card_series={0: "h100", 1: ""})
    cards = [{"index": 0, "uuid": "a"}, {"index": 1, "uuid": "b"}, {"index": 2, "uuid": "c"}]
    assert _with_series(node, cards) == (
        {"index": 0, "uuid": "a", "series": "h100"},
        {"index": 1, "uuid": "b", "series": ""},
    )
    assert _with_series(None, cards) == ()


def test_Q8_a_preemptor_waits_for_its_victims_by_name_until_the_last_deadline():
    """x__preempting__mutmut_1–_24: the reason, the message with every victim and the
    latest deadline (not the first), the victims as its numbers, its places kept."""
    victims = [
        {"job": "trainingjob-4", "deadline": "2026-12-01T00:02:00+00:00", "project": 1},
        {"job": "trainingjob-5", "deadline": "2026-12-01T00:05:00+00:00", "project": 1},
        {"job": "trainingjob-6", "deadline": "2026-12-01T00:03:00+00:00", "project": 1},
    ]
    wait = _preempting(Wait("capacity", "needs 8 cards", {}, 2, 3), victims)
    assert wait == Wait(
        "preempting",
        "preempting 3 job(s) for its cards: trainingjob-4, trainingjob-5, trainingjob-6;"
        " stopped by 2026-12-01T00:05:00+00:00 at the latest",
        {"victims": victims},
        2,
        3,
    )


def test_Q7_each_preemptor_records_its_victims_in_one_event_a_statement_a_kind():
    """x__preemptors_record__mutmut_1–_21: before, no victims; after, the preemptor by its
    name and its victims; one call per kind of record."""
    training, lifecycle = TrainingJob(pk=7), LifecycleJob(pk=3)
    asks = [
        Request(key=("trainingjob", 7, 0), order=(START,), cards=8),
        Request(key=("lifecyclejob", 3, 0), order=(START,), cards=8),
    ]
    items = {asks[0]: Waiting(owner=training), asks[1]: Waiting(owner=lifecycle)}
    shown = {"job": "trainingjob-4", "deadline": "2026-12-01T00:02:00+00:00", "project": 1}
    stopped = {asks[0].key: [shown], asks[1].key: [shown, shown]}
    with patch("placement.services.preempting.audit_record_each") as recording:
        _preemptors_record(stopped, items)
    assert recording.call_args_list == [
        call(
            actor=ALLOCATOR,
            target_type="placement.trainingjob",
            events=[
                (
                    "trainingjob.preempts",
                    7,
                    {"victims": []},
                    {"preemptor": "trainingjob-7", "victims": [shown]},
                )
            ],
        ),
        call(
            actor=ALLOCATOR,
            target_type="placement.lifecyclejob",
            events=[
                (
                    "lifecyclejob.preempts",
                    3,
                    {"victims": []},
                    {"preemptor": "lifecyclejob-3", "victims": [shown, shown]},
                )
            ],
        ),
    ]
