"""Preemption's writer (placement.services.preempting) on the boundaries a mutant moved
(issue 47), on the real database: a victim that ended, or whose job moved on, between the
pass's read and its locks is left out, and the victims after it are still stopped (Q5, Q6);
the one stopped audited with its move whole and its members' stop stamped with the pass's
time (Q6, Q7); a pass with nothing running preempts nothing, and says so; one that placed a
request still preempts for the next (Q5); a preemptor's wait on its victims the same on the
pass after (Q8); a lifecycle job on borrowed cards is preempted as a training job is (Q5).
Each test was seen failing against the mutants it names; the pure ones are
test_preempting_boundaries.py's."""

from datetime import UTC, datetime

import pytest

from audit.models import AuditEvent
from audit.services import Actor
from nodes.models import Node
from nodes.services.cordons import node_cordon
from placement.decide import Request
from placement.models import Attempt, LifecycleJob, Member, TrainingJob
from placement.preemption import Running
from placement.services.allocator import allocate
from placement.services.preempting import _stop
from placement.services.submission import lifecycle_job_submit
from placement.services.waiting import WaitingJob
from tests.conftest import SYSTEM
from tests.placement import test_preempting
from tests.placement.test_preempting import borrowed_job_running, fresh, running_for
from tests.placement.test_quotas import QUOTAS, submit
from tests.placement.test_running_rules import report

NOW = datetime(2026, 12, 1, tzinfo=UTC)
lab = test_preempting.lab
shared = test_preempting.shared


def as_victim(job: TrainingJob) -> Running:
    attempt = Attempt.objects.get(training_job=job)
    return Running(
        key=("trainingjob", job.pk),
        project=job.project_id,
        quota=(job.project_id, ""),
        borrowed=True,
        preemptible=False,
        priority=0,
        started_at=NOW,
        members=(),
        attempt=attempt.pk,
    )


@pytest.mark.parametrize("moved", ["attempt", "job"])
def test_Q5_Q6_a_victim_gone_meanwhile_is_left_out_and_the_next_is_still_stopped(
    shared, member, vision, moved
):
    """x__stop__mutmut_40 (its attempt ended: ``break``), _42 (its job ended:
    ``break``); the victim's event before and after (_126–_135), its members' stop at the
    pass's time (_138)."""
    first, second = (submit(member, "ml", f"borrower-{n}", cards=4) for n in (1, 2))
    allocate(fleet_id=shared.id)
    for job in (first, second):
        running_for(job, 3600)
    owner = submit(vision, "cv", "owner", cards=8)
    if moved == "attempt":
        Attempt.objects.filter(training_job=first).update(state="succeeded")
    else:
        TrainingJob.objects.filter(pk=first.pk).update(state="cancelled")
    waiter = Request(
        key=("trainingjob", owner.pk, 0), order=(NOW,), cards=8, project=owner.project_id
    )
    planned = [(waiter, [as_victim(first), as_victim(second)])]
    stopped = _stop(planned, {waiter: WaitingJob(owner=owner)}, NOW)
    assert [shown["job"] for shown in stopped[waiter.key]] == [f"trainingjob-{second.pk}"]
    victim = fresh(second)
    assert victim.state == "preempting"
    [event] = AuditEvent.objects.filter(action="trainingjob.preempting")
    assert (event.target_id, event.before, event.after) == (
        str(second.pk),
        {"state": "running"},
        {
            "state": "preempting",
            "reason": "preempted",
            "preemption": victim.preemption,
            "attempt": 1,
        },
    )
    stamps = Member.objects.filter(attempt__training_job=second).values_list(
        "stop_requested_at", flat=True
    )
    assert list(stamps) == [NOW]
    assert fresh(first).state == ("running" if moved == "attempt" else "cancelled")


def test_Q5_a_pass_with_nothing_running_preempts_nothing(shared, vision):
    """A request within its guarantee waits on a cordoned node, nothing runs to take from:
    the pass counts none preempted (x_preempt__mutmut_34: one)."""
    node_cordon(actor=SYSTEM, node=Node.objects.get(fleet=shared), reason="firmware")
    submit(vision, "cv", "owner", cards=8)
    assert allocate(fleet_id=shared.id) == {"allocated": 0, "waiting": 1, "preempted": 0}


def test_Q5_a_request_placed_in_the_pass_does_not_end_preemption_for_the_next(
    node_fleet, gpu_node, admin_api, member, vision
):
    """cv is owed 12 cards: its first job is placed on the free node, its second waits and
    takes the borrower's 8 (x_preempt__mutmut_7: the placed one ended the loop)."""
    gpu_node(node_fleet, address="10.0.0.1:1")
    gpu_node(node_fleet, cards=4, address="10.0.0.2:1")
    quotas = [{"project": "cv", "guaranteed": 12}, {"project": "ml"}]
    assert admin_api.request("PUT", QUOTAS, {"quotas": quotas}).status_code == 200
    borrower = submit(member, "ml", "borrower", cards=8)
    allocate(fleet_id=node_fleet.id)
    running_for(borrower, 3600)
    small = submit(vision, "cv", "small", cards=4)
    submit(vision, "cv", "big", cards=8)
    assert allocate(fleet_id=node_fleet.id)["preempted"] == 1
    assert (fresh(small).state, fresh(borrower).state) == ("starting", "preempting")


def test_Q8_a_preemptors_wait_on_its_stopping_victims_is_the_same_on_the_next_pass(
    shared, member, vision
):
    """Whose each victim is, kept on the pass after (x__stopping__mutmut_31, _32: a reader
    of the victim's project would be told it is another project's work, R23)."""
    victim, _ = borrowed_job_running(shared, member)
    owner = submit(vision, "cv", "owner", cards=8)
    allocate(fleet_id=shared.id)
    first = fresh(owner).waiting
    allocate(fleet_id=shared.id)
    assert (
        fresh(owner).waiting["numbers"]
        == first["numbers"]
        == {
            "victims": [
                {
                    "job": f"trainingjob-{victim.pk}",
                    "deadline": fresh(victim).preemption["deadline"],
                    "project": victim.project_id,
                }
            ]
        }
    )


def test_Q5_a_lifecycle_job_on_borrowed_cards_is_preempted_as_a_training_job_is(
    shared, member, vision
):
    """x_running_jobs__mutmut_86, _89, _90 (a lifecycle job's members matched to no
    running job: never a victim)."""
    job = lifecycle_job_submit(
        actor=Actor.of_user(member),
        project="ml",
        name="merge",
        kind="merge",
        cards=8,
        script="python merge.py",
    )
    allocate(fleet_id=shared.id)
    for one in Member.objects.filter(attempt__lifecycle_job=job):
        report(one)
    Attempt.objects.filter(lifecycle_job=job).update(started_at=NOW)
    assert LifecycleJob.objects.get(pk=job.pk).state == "running"
    submit(vision, "cv", "owner", cards=8)
    assert allocate(fleet_id=shared.id)["preempted"] == 1
    assert LifecycleJob.objects.get(pk=job.pk).state == "preempting"
