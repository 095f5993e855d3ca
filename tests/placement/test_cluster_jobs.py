"""Jobs on a cluster Fleet (DESIGN §6, §7): the job's state read from its manager's, and
cancel passed on to the manager (R10) — here KubeRay through the official client against
replayed API responses (tests/nodes/kube_replay.py); Slurm's against the real cluster is
tests/slurm."""

import pytest
from django.test import TestCase

from audit.models import AuditEvent
from nodes.backends.base import JobRead
from placement import handover
from placement.handover import cluster_job_handover, cluster_jobs_track
from placement.models import Attempt, TrainingJob
from tests.audit.scenarios import RAYJOB, RAYJOBS, tasks_run_at_once


@pytest.fixture
def handed_over(world):
    job, replay = world.cluster_job()
    cluster_job_handover(job.pk)
    return TrainingJob.objects.get(pk=job.pk), replay


def test_a_cluster_jobs_state_follows_its_managers(handed_over, member_api):
    job, replay = handed_over
    assert (job.backend_state, job.state) == ("SUBMITTED", "queued")
    replay.serve("GET", RAYJOB, "rayjob-running.json")
    cluster_jobs_track()
    shown = member_api.get("/api/training-jobs").json()["results"][0]
    assert (shown["backend_state"], shown["state"]) == ("RUNNING", "running")
    replay.serve("GET", RAYJOB, {"kind": "RayJob", "status": {"jobStatus": "FAILED"}})
    cluster_jobs_track()
    job = TrainingJob.objects.get(pk=job.pk)
    assert (job.state, job.reason) == ("failed", "failed") and job.ended_at is not None


def test_R10_cancel_on_a_cluster_fleet_is_passed_to_the_manager_and_read_back(
    handed_over, member_api
):
    job, replay = handed_over
    replay.serve("DELETE", RAYJOB, {"kind": "Status", "status": "Success"})
    with tasks_run_at_once(), TestCase.captureOnCommitCallbacks(execute=True):
        response = member_api.post(f"/api/training-jobs/{job.pk}/cancel")
    assert response.status_code == 200 and response.json()["cancel_requested_at"]
    assert [(r.method, r.path) for r in replay.requests][-1] == ("DELETE", RAYJOB)
    assert TrainingJob.objects.get(pk=job.pk).backend_cancel_sent_at is not None
    assert AuditEvent.objects.filter(action="trainingjob.cancel_sent").count() == 1
    replay.serve("GET", RAYJOB, {"kind": "RayJob", "status": {"jobStatus": "STOPPED"}})
    cluster_jobs_track()  # the end read back; the cancel is not sent again
    job = TrainingJob.objects.get(pk=job.pk)
    assert (job.state, job.reason) == ("cancelled", "cancelled")
    assert [r.method for r in replay.requests].count("DELETE") == 1


def test_R10_a_manager_away_is_asked_again_on_the_next_pass(handed_over, member_api):
    job, replay = handed_over
    replay.serve("DELETE", RAYJOB, "status-500.json", status=500)
    replay.serve("GET", RAYJOB, "rayjob-running.json")
    with tasks_run_at_once(), TestCase.captureOnCommitCallbacks(execute=True):
        member_api.post(f"/api/training-jobs/{job.pk}/cancel")
    assert TrainingJob.objects.get(pk=job.pk).backend_cancel_sent_at is None
    replay.serve("DELETE", RAYJOB, {"kind": "Status", "status": "Success"})
    cluster_jobs_track()
    assert TrainingJob.objects.get(pk=job.pk).backend_cancel_sent_at is not None


def test_R10_a_cluster_job_not_yet_handed_over_is_cancelled_at_once_and_never_handed_over(
    world,
    member_api,
):
    job, replay = world.cluster_job()
    response = member_api.post(f"/api/training-jobs/{job.pk}/cancel")
    assert response.json()["state"] == "cancelled"
    cluster_job_handover(job.pk)
    assert not [r for r in replay.requests if r.method == "POST"]
    assert TrainingJob.objects.get(pk=job.pk).backend_job_id == ""


def test_a_lifecycle_job_on_a_cluster_fleet_is_handed_over_as_a_training_job_is(
    world,
    member_api,
):
    from tests.audit.scenarios import RAYJOBS

    _, replay = world.kube()
    replay.serve("POST", RAYJOBS, "rayjob-created.json", status=201)
    replay.serve("GET", RAYJOB, "rayjob-running.json")
    response = member_api.post(
        "/api/lifecycle-jobs",
        {"project": "ml", "name": "export", "kind": "export", "cards": 1, "script": "python x.py"},
    )
    assert response.status_code == 201, response.content
    cluster_jobs_track()  # the pass hands over what is waiting, then reads it back
    shown = member_api.get("/api/lifecycle-jobs").json()["results"][0]
    assert (shown["backend_job_id"], shown["state"]) == ("ml-jobs/llama-sft-7b-x9k2p", "running")
    assert AuditEvent.objects.filter(action="lifecyclejob.handed_over").count() == 1


def test_a_managers_states_move_the_job_by_its_table(world):
    """The moves only a cluster's manager makes (tests/placement/test_lifecycles.py leaves
    them to this test): queued → running → queued again (its manager requeued it) →
    succeeded; another job queued → failed."""
    from audit.services import Actor
    from placement.services.submission import training_job_submit
    from tests.audit.scenarios import RAYJOBS
    from tuneplane.lifecycle import recording

    first, replay = world.cluster_job()
    with recording() as made:
        replay.serve("POST", RAYJOBS, "rayjob-created.json", status=201)
        cluster_job_handover(first.pk)
        for state in ("RUNNING", "PENDING", "SUCCEEDED"):
            replay.serve("GET", RAYJOB, {"kind": "RayJob", "status": {"jobStatus": state}})
            cluster_jobs_track()
        second = training_job_submit(
            actor=Actor.of_user(world.member), project="ml", name="eval", cards=1, script="x"
        )
        replay.serve("POST", RAYJOBS, "status-500.json", status=500)
        cluster_job_handover(second.pk)  # refused: handover_failed
    assert TrainingJob.objects.get(pk=first.pk).state == "succeeded"
    assert TrainingJob.objects.get(pk=second.pk).state == "failed"
    assert {
        ("job", "queued", "running"),
        ("job", "running", "queued"),
        ("job", "queued", "succeeded"),
        ("job", "queued", "failed"),
    } <= made


@pytest.mark.parametrize(
    ("state", "backend_state", "shown"),
    [
        ("running", "PREEMPTED", "preempting"),  # Q6: the manager preempted it; we show it
        ("preempting", "PENDING", "queued"),  # requeued by the manager (PreemptMode=REQUEUE)
        ("preempting", "RUNNING", "running"),  # requeued and running again, read late
        ("queued", "PREEMPTED", "queued"),  # read out of order: kept until the manager says more
        ("running", "COMPLETED", "succeeded"),
        ("failed", "RUNNING", "failed"),  # an ended job moves no more
        ("running", "SOMETHING_NEW", "running"),
    ],
)
def test_Q6_a_cluster_managers_preemption_is_shown_and_a_requeue_followed(
    state, backend_state, shown
):
    assert handover.followed(state, backend_state) == shown


# -- one list per Fleet per pass ------------------------------------------------------------
# A Kubernetes Fleet's tracking pass reads its open jobs' states from one paged list of its
# RayJobs (KubeRay's printer columns, as a Table), and reads a job on its own only where the
# list cannot answer for it. Against the real API server: tests/kube/test_console_jobs.py.

MANY = 50
COLUMNS = ("Name", "job status", "deployment status", "ray cluster name", "start time")


def _table(rows: dict[str, tuple[str | None, str | None]]) -> dict:
    """The console's RayJobs as the API server lists them for ``Accept: ...;as=Table``
    (tests/kube: the real server's answer, cut to the columns the console reads and one)."""
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": "4711"},
        "columnDefinitions": [
            {"name": name, "type": "string", "format": "", "description": "", "priority": 0}
            for name in COLUMNS
        ],
        "rows": [
            {"cells": [name, job, deployment, f"{name}-raycluster", None], "object": None}
            for name, (job, deployment) in rows.items()
        ],
    }


def _gone(name: str) -> dict:
    """The API server's 404 for a RayJob it no longer has: its Status names the object."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'rayjobs.ray.io "{name}" not found',
        "reason": "NotFound",
        "details": {"name": name, "group": "ray.io", "kind": "rayjobs"},
        "code": 404,
    }


@pytest.fixture
def many_handed_over(world):
    """MANY training jobs on one Kubernetes Fleet, each handed over as its own RayJob
    (sft-0 … sft-49), last read SUBMITTED."""
    from audit.services import Actor
    from placement.services.submission import training_job_submit

    first, replay = world.cluster_job()
    jobs = [first] + [
        training_job_submit(
            actor=Actor.of_user(world.member), project="ml", name="sft", cards=1, script="x"
        )
        for _ in range(MANY - 1)
    ]
    for i, job in enumerate(jobs):
        TrainingJob.objects.filter(pk=job.pk).update(
            backend_job_id=f"ml-jobs/sft-{i}", backend_state="SUBMITTED", max_attempts=1
        )
    return [TrainingJob.objects.get(pk=job.pk) for job in jobs], replay


def _reads(replay) -> list[str]:
    """The GETs of RayJobs the console sent: the list's path, or one RayJob's."""
    return [r.path for r in replay.requests if r.method == "GET" and r.path.startswith(RAYJOBS)]


def _states(jobs) -> list[str]:
    return [TrainingJob.objects.get(pk=job.pk).state for job in jobs]


def test_a_pass_over_50_handed_over_jobs_reads_them_with_one_list(many_handed_over):
    """Before, one GET per job per pass (50 here)."""
    jobs, replay = many_handed_over
    replay.serve("GET", RAYJOBS, _table({f"sft-{i}": ("RUNNING", "Running") for i in range(MANY)}))

    assert cluster_jobs_track() == {"changed": MANY, "failed": 0}

    assert _reads(replay) == [RAYJOBS]
    [listed] = [r for r in replay.requests if r.path == RAYJOBS]
    assert "as=Table" in listed.headers["accept"] and "limit=500" in listed.query
    assert _states(jobs) == ["running"] * MANY
    cluster_jobs_track()  # nothing changed: the list again, and no job read alone
    assert _reads(replay) == [RAYJOBS, RAYJOBS]


def test_H8_a_failure_listed_is_read_alone_for_its_class(many_handed_over):
    """The list carries states, not KubeRay's reason and message: a RayJob listed FAILED is
    read on its own, and a node lost under it is infrastructure (queued again, max_attempts
    1 unspent); one failed by its own app fails the job."""
    jobs, replay = many_handed_over
    rows = {f"sft-{i}": ("RUNNING", "Running") for i in range(MANY)}
    rows["sft-0"] = rows["sft-1"] = ("FAILED", "Failed")
    replay.serve("GET", RAYJOBS, _table(rows))
    failed = {"jobStatus": "FAILED", "jobDeploymentStatus": "Failed", "reason": "AppFailed"}
    node_lost = {**failed, "message": "Job supervisor actor died: its node has died."}
    replay.serve("GET", f"{RAYJOBS}/sft-0", {"kind": "RayJob", "status": node_lost})
    replay.serve("GET", f"{RAYJOBS}/sft-1", {"kind": "RayJob", "status": failed})

    cluster_jobs_track()

    assert _reads(replay) == [RAYJOBS, f"{RAYJOBS}/sft-0", f"{RAYJOBS}/sft-1"]
    assert _states(jobs) == ["queued", "failed"] + ["running"] * (MANY - 2)
    assert [a.end_class for a in Attempt.objects.order_by("training_job_id")] == [
        "infrastructure",
        "user",
    ]


def test_a_job_missing_from_the_list_is_read_alone_and_ends_if_gone(many_handed_over):
    """sft-7 deleted behind the console's back: not listed, its own read answers 404 naming
    it, and the job ends (cancelled, as KubeRay's finalizer stopped it); sft-8, listed by
    another namespace's list (a Fleet's kuberay_namespace changed), is read where it is."""
    jobs, replay = many_handed_over
    TrainingJob.objects.filter(pk=jobs[8].pk).update(backend_job_id="old-ns/sft-8")
    rows = {f"sft-{i}": ("RUNNING", "Running") for i in range(MANY) if i not in (7, 8)}
    replay.serve("GET", RAYJOBS, _table(rows))
    replay.serve("GET", f"{RAYJOBS}/sft-7", _gone("sft-7"), status=404)
    replay.serve("GET", "/apis/ray.io/v1/namespaces/old-ns/rayjobs/sft-8", "rayjob-running.json")

    assert cluster_jobs_track()["failed"] == 0

    assert _reads(replay) == [RAYJOBS, f"{RAYJOBS}/sft-7"]
    assert replay.requests[-1].path == "/apis/ray.io/v1/namespaces/old-ns/rayjobs/sft-8"
    gone = TrainingJob.objects.get(pk=jobs[7].pk)
    assert (gone.backend_state, gone.state) == ("STOPPED", "cancelled") and gone.ended_at
    assert _states(jobs).count("running") == MANY - 1


@pytest.mark.parametrize("status", [403, 404, 500])
def test_a_list_refused_leaves_each_job_read_alone(many_handed_over, status):
    """A ServiceAccount that may get RayJobs but not list them (403), RayJobs not served yet
    (404), an error: each job is read alone, as before, and followed."""
    jobs, replay = many_handed_over
    replay.serve("GET", RAYJOBS, "status-500.json", status=status)
    for i in range(MANY):
        replay.serve("GET", f"{RAYJOBS}/sft-{i}", "rayjob-running.json")

    assert cluster_jobs_track() == {"changed": MANY, "failed": 0}

    assert _reads(replay) == [RAYJOBS] + [f"{RAYJOBS}/sft-{i}" for i in range(MANY)]
    assert _states(jobs) == ["running"] * MANY


@pytest.mark.parametrize(
    ("listed", "taken"),
    [
        ("RUNNING", True),
        ("PENDING", True),
        ("Initializing", True),
        ("SUCCEEDED", True),
        ("STOPPED", True),  # KubeRay's own stop: cancelled, no class to read
        ("PREEMPTED", True),
        ("FAILED", False),  # H8: its class needs KubeRay's reason and message
        ("failed", False),
        ("NODE_FAIL", False),  # a manager's failure word of any backend's
        (None, False),  # not listed: gone, or not the list's to say
    ],
)
def test_what_a_pass_takes_from_the_list_and_what_it_reads_alone(listed, taken):
    read = handover._listed_read(listed)
    assert (read == JobRead(listed)) if taken else read is None


def test_a_backend_without_a_list_reads_each_job_alone(many_handed_over, monkeypatch):
    """A backend with no job_states() (Slurm's): one read per job, as ever."""
    jobs, _ = many_handed_over
    read = []

    class ReadsOneByOne:
        def job_read(self, job_id):
            read.append(job_id)
            return JobRead("RUNNING")

    monkeypatch.setattr(handover, "backend_for", lambda fleet: ReadsOneByOne())

    cluster_jobs_track()

    assert read == [f"ml-jobs/sft-{i}" for i in range(MANY)]
    assert _states(jobs) == ["running"] * MANY
