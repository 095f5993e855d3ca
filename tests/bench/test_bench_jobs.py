"""`make bench`: jobs on node Fleets (DESIGN §7).

Not timed tests: they print what they measure.
- The allocator: 1,000 queued one-card jobs onto 1,000 nodes × 8 cards, in passes, as
  allocations per second and queries per pass (flat: asserted by tests/placement).
- Admitted to running with a connected agent on this machine: p50 and p99 from the API's
  answer to the job reading ``running``, through a real Celery worker, gateway and agent.
- Preemption (Q5, Q6): from a preemptor's admission to its victim's preemption decided and
  to the victim's member ended by SIGTERM, p50 over 20 runs, on the same real parts.
"""

import os
import statistics
import time
import uuid
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from nodes.choices import SchedulingState
from nodes.models import ControlSession, Node
from nodes.selectors import cards_summary
from placement.models import Attempt, CardHold, Member, TrainingJob
from placement.services.allocator import allocate
from tests.conftest import H100_DEVICE_INVENTORY, Api

pytestmark = [pytest.mark.bench]

NODES = int(os.environ.get("BENCH_JOB_NODES", 1000))
JOBS = int(os.environ.get("BENCH_JOBS", 1000))
SUBMISSIONS = int(os.environ.get("BENCH_SUBMISSIONS", 40))


def _fleet_of_nodes(fleet):
    now = timezone.now()
    lease = now + timedelta(hours=1)
    cards = cards_summary(H100_DEVICE_INVENTORY)
    nodes = Node.objects.bulk_create(
        [
            Node(
                id=f"n-bench-{i:05d}",
                fleet=fleet,
                hostname=f"h{i}",
                address=f"10.{i // 250}.{i % 250}.1:9100",
                scheduling_state=SchedulingState.SCHEDULABLE,
                inventory={
                    **H100_DEVICE_INVENTORY,
                    "devices": [
                        {**d, "uuid": f"GPU-{i:05d}-{d['index']}"}
                        for d in H100_DEVICE_INVENTORY["devices"]
                    ],
                },
                **cards,
                inventory_observed_at=now,
                last_seen_at=now,
                lease_expires_at=lease,
            )
            for i in range(NODES)
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
    Node.objects.update(inventory_observed_at=timezone.now())


def _one_pass(fleet, member, queue: list[dict]):
    """The queue's jobs queued at once on ``fleet``, then one allocator pass, timed, with
    the queries it made."""
    TrainingJob.objects.bulk_create(
        [
            TrainingJob(
                fleet=fleet,
                name=f"job-{n}",
                command=["python", "train.py"],
                admission={"fleet": fleet.id},
                created_by=member,
                **fields,
            )
            for n, fields in enumerate(queue)
        ]
    )
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    started = time.perf_counter()
    with CaptureQueriesContext(connection) as captured:
        done = allocate(fleet_id=fleet.id)
    return done, time.perf_counter() - started, captured


def test_bench_allocation_1000_jobs_onto_1000_nodes(node_fleet, member, project, capsys):
    _fleet_of_nodes(node_fleet)
    done, seconds, captured = _one_pass(
        node_fleet, member, [{"project": project, "cards": 1} for _ in range(JOBS)]
    )
    assert done == {"allocated": JOBS, "waiting": 0, "preempted": 0}
    with capsys.disabled():
        print(
            f"\nallocation: {JOBS} one-card jobs onto {NODES} nodes x 8 cards in one pass: "
            f"{seconds:.2f} s, {JOBS / seconds:.0f} allocations/s, {len(captured)} queries"
        )


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_bench_admitted_to_running_with_a_connected_agent(running_node, member_api, capsys):
    samples = []
    for n in range(SUBMISSIONS):
        response = member_api.post(
            "/api/training-jobs",
            {"project": "ml", "name": f"b{n}", "cards": 1, "command": ["sleep", "30"]},
        )
        assert response.status_code == 201, response.content
        answered = time.perf_counter()
        job_id = response.json()["id"]
        while TrainingJob.objects.filter(pk=job_id, state="running").count() == 0:
            time.sleep(0.005)
            assert time.perf_counter() - answered < 30, "not running within 30 s"
        samples.append(time.perf_counter() - answered)
        member_api.post(f"/api/training-jobs/{job_id}/cancel")
        while CardHold.objects.filter(member__attempt__training_job_id=job_id).exists():
            time.sleep(0.02)  # its card back before the next one is measured
    ordered = sorted(samples)
    p50, p99 = statistics.median(ordered), ordered[max(0, int(len(ordered) * 0.99) - 1)]
    with capsys.disabled():
        print(
            f"\nadmitted -> running ({SUBMISSIONS} jobs, worker + gateway + agent on this "
            f"machine): p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
            f"max {ordered[-1] * 1000:.0f} ms"
        )


QUOTA_PROJECTS = int(os.environ.get("BENCH_QUOTA_PROJECTS", 50))
QUOTA_JOBS = int(os.environ.get("BENCH_QUOTA_JOBS", 5000))


def test_bench_allocation_with_quotas_50_projects_5000_jobs(node_fleet, member, capsys):
    """Q3 at scale: one pass over 5,000 queued jobs of 50 projects, each guaranteed 64
    cards of the 8,000, onto 1,000 nodes × 8 cards."""
    import random

    from placement.models import Quota
    from tuneplane.models import Project

    _fleet_of_nodes(node_fleet)
    projects = Project.objects.bulk_create(
        [Project(slug=f"p{n:02d}", name=f"P{n}") for n in range(QUOTA_PROJECTS)]
    )
    Quota.objects.bulk_create(
        [
            Quota(fleet=node_fleet, project=p, guaranteed=64, limit=400, weight=1 + n % 3)
            for n, p in enumerate(projects)
        ]
    )
    sizes = random.Random(38)
    queue = [
        {
            "project": projects[n % QUOTA_PROJECTS],
            "cards": sizes.choice((1, 1, 2, 4, 8)),
            "priority": sizes.choice((0, 0, 0, 1)),
        }
        for n in range(QUOTA_JOBS)
    ]
    done, seconds, captured = _one_pass(node_fleet, member, queue)
    assert done["allocated"] > 0
    held: dict[int, int] = {}
    for project_id, cards in Member.objects.values_list("project_id", "cards"):
        held[project_id] = held.get(project_id, 0) + len(cards)
    limits = dict(Quota.objects.filter(fleet=node_fleet).values_list("project_id", "limit"))
    assert all(held[p] <= limits[p] for p in held)  # Q1: no project past its limit at scale
    with capsys.disabled():
        print(
            f"\nallocation with quotas: {QUOTA_JOBS} jobs of {QUOTA_PROJECTS} projects onto "
            f"{NODES} nodes x 8 cards in one pass: {done['allocated']} placed in "
            f"{seconds:.2f} s, {done['allocated'] / seconds:.0f} placements/s, "
            f"{len(captured)} queries"
        )
    # Q5 at scale: what was placed has run an hour, and ten projects new to the Fleet, each
    # guaranteed 64 cards, queue 50 jobs each: the next pass weighs every running job as a
    # victim for what waits within its guarantee, and stops the borrowed work it takes.
    an_hour_ago = timezone.now() - timedelta(hours=1)
    TrainingJob.objects.filter(state="starting").update(state="running")
    Attempt.objects.update(state="running", started_at=an_hour_ago)
    Member.objects.update(state="running", started_at=an_hour_ago)
    newcomers = Project.objects.bulk_create(
        [Project(slug=f"new{n:02d}", name=f"New {n}") for n in range(10)]
    )
    Quota.objects.bulk_create(
        [Quota(fleet=node_fleet, project=p, guaranteed=64, limit=64) for p in newcomers]
    )
    more = [{"project": newcomers[n % 10], "cards": sizes.choice((1, 2, 4, 8))} for n in range(500)]
    done, seconds, captured = _one_pass(node_fleet, member, more)
    with capsys.disabled():
        print(
            f"the next pass, {done['allocated'] + done['waiting']} queued and "
            f"{Attempt.objects.filter(state='running').count()} running an hour: "
            f"{done['preempted']} preempted, {done['allocated']} placed, in {seconds:.2f} s, "
            f"{len(captured)} queries"
        )


PREEMPTIONS = int(os.environ.get("BENCH_PREEMPTIONS", 20))
# Its first attempt waits to be stopped and exits at once on SIGTERM.
WAITS_FOR_SIGTERM = 'trap "exit 143" TERM; sleep 600 & wait'


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "running_node",
    [{"TUNEPLANE_PREEMPT_MIN_RUNTIME": "0", "TUNEPLANE_PREEMPT_GRACE": "30"}],
    indirect=True,
)
def test_bench_preempted_within_seconds_of_the_preemptors_admission(
    running_node, admin_api, member_api, vision, capsys
):
    """Q5, Q6: from cv's job (within its guarantee) admitted — its ``created_at`` — to ml's
    borrowed job on the whole node preempted (the pass's decision, its ``at``) and to its
    member ended by SIGTERM (the agent sent it, the process exited 143, the node reported
    it, the console recorded it): an upper bound on when SIGTERM was sent."""
    vision_api = Api(vision)
    quotas = {"quotas": [{"project": "cv", "guaranteed": 8}, {"project": "ml"}]}
    assert admin_api.request("PUT", "/api/fleets/gpu-lab/quotas", quotas).status_code == 200
    decided, ended = [], []
    for n in range(PREEMPTIONS):
        borrower = member_api.post(
            "/api/training-jobs",
            {"project": "ml", "name": f"b{n}", "cards": 8, "script": WAITS_FOR_SIGTERM},
        ).json()["id"]
        until(TrainingJob.objects.filter(pk=borrower, state="running"))
        response = vision_api.post(
            "/api/training-jobs",
            {"project": "cv", "name": f"o{n}", "cards": 8, "command": ["true"]},
        )
        assert response.status_code == 201, response.content
        owner = response.json()["id"]
        member = Member.objects.filter(attempt__training_job_id=borrower)
        until(member.filter(state="cancelled"))
        admitted = TrainingJob.objects.get(pk=owner).created_at
        preemption = TrainingJob.objects.get(pk=borrower).preemption
        decided.append((datetime.fromisoformat(preemption["at"]) - admitted).total_seconds())
        ended.append((member.get().ended_at - admitted).total_seconds())
        assert member.get().exit_code == 143  # SIGTERM, not the SIGKILL after the grace
        member_api.post(f"/api/training-jobs/{borrower}/cancel")
        until(TrainingJob.objects.filter(pk=owner, state="succeeded"))
        until(CardHold.objects.all(), present=False)  # every card back before the next run
    with capsys.disabled():
        for name, samples in (("decided", decided), ("SIGTERM'd and ended", ended)):
            ordered = sorted(samples)
            print(
                f"\npreemptor admitted -> victim {name} ({PREEMPTIONS} runs, worker + gateway "
                f"+ agent on this machine): p50 {statistics.median(ordered) * 1000:.0f} ms, "
                f"max {ordered[-1] * 1000:.0f} ms"
            )


def until(rows, present: bool = True, timeout: float = 60) -> None:
    """Polls until ``rows`` (a queryset) has a row, or none when not ``present``."""
    deadline = time.perf_counter() + timeout
    while rows.exists() != present:
        assert time.perf_counter() < deadline, f"not within {timeout} s: {rows.query}"
        time.sleep(0.005)
