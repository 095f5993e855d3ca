"""Jobs on a cluster Fleet (DESIGN §6, §7): the job's state read from its manager's, and
cancel passed on to the manager (R10) — here KubeRay through the official client against
replayed API responses (tests/nodes/kube_replay.py); Slurm's against the real cluster is
tests/slurm."""

import pytest
from django.test import TestCase

from audit.models import AuditEvent
from placement import handover
from placement.handover import cluster_job_handover, cluster_jobs_track
from placement.models import TrainingJob
from tests.audit.scenarios import RAYJOB, tasks_run_at_once


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
