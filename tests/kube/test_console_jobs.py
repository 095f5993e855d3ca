"""The console's own tracking (placement/handover.py) of a job on a Kubernetes Fleet, against
the real API server: handed over, read back as KubeRay moves it, cancelled (R10), its RayJob
deleted behind the console's back, the API server down for a pass — each ends in a clear
state or is retried on the next pass, never a job left waiting for ever.

The Fleet's nodes are read once from the replay (a node list needs the full kube-apiserver);
its config is then pointed at the real server for the jobs."""

import pytest
from django.test import TestCase

from nodes.backends.kubernetes import RAY_GROUP, RAY_VERSION, RAYJOB_PLURAL
from placement.handover import cluster_job_handover, cluster_jobs_track
from placement.models import TrainingJob
from tests.audit.scenarios import tasks_run_at_once
from tests.kube_apiserver import CONTEXT

pytestmark = [pytest.mark.kube, pytest.mark.e2e]


@pytest.fixture
def on_real_server(world, kube, namespace):
    """A training job admitted to a Kubernetes Fleet whose jobs go to the real server."""
    job, _replay = world.cluster_job()
    job.fleet.config = {"kube_context": CONTEXT, "kuberay_namespace": namespace}
    job.fleet.save(update_fields=["config"])
    return job


def _reread(job) -> TrainingJob:
    return TrainingJob.objects.get(pk=job.pk)


def test_a_job_is_handed_over_and_follows_kuberay_to_its_end(on_real_server, kuberay):
    job = _reread(cluster_job_handover(on_real_server.pk))
    assert job.backend_error == "" and job.backend_job_id.startswith(f"{kuberay.namespace}/")
    name = job.backend_job_id.partition("/")[2]
    assert name.endswith(job.handover_key)  # keyed: a resumed handover finds it

    kuberay.admit(name)
    kuberay.run(name)
    cluster_jobs_track()
    assert (_reread(job).backend_state, _reread(job).state) == ("RUNNING", "running")
    kuberay.finish(name, "SUCCEEDED")
    cluster_jobs_track()
    assert (_reread(job).backend_state, _reread(job).state) == ("SUCCEEDED", "succeeded")


def test_R10_a_cancelled_job_ends_cancelled_once_kuberay_lets_its_rayjob_go(
    on_real_server, kuberay, member_api
):
    job = _reread(cluster_job_handover(on_real_server.pk))
    name = job.backend_job_id.partition("/")[2]
    kuberay.admit(name)
    kuberay.run(name)

    with tasks_run_at_once(), TestCase.captureOnCommitCallbacks(execute=True):
        member_api.post(f"/api/training-jobs/{job.pk}/cancel")
    assert _reread(job).backend_cancel_sent_at is not None
    cluster_jobs_track()  # KubeRay's finalizer still holds it: running
    assert _reread(job).state == "running"
    kuberay.reap(name)
    cluster_jobs_track()

    job = _reread(job)
    assert (job.backend_state, job.state, job.reason) == ("STOPPED", "cancelled", "cancelled")


def test_a_rayjob_deleted_behind_the_consoles_back_ends_the_job(on_real_server, kuberay, api):
    """Before the fix, a 404 at every pass: the job stayed running for ever."""
    job = _reread(cluster_job_handover(on_real_server.pk))
    name = job.backend_job_id.partition("/")[2]
    kuberay.admit(name)
    kuberay.run(name)
    cluster_jobs_track()
    kuberay.reap(name)  # no finalizer left: the delete below removes it at once
    api.delete_namespaced_custom_object(
        RAY_GROUP, RAY_VERSION, kuberay.namespace, RAYJOB_PLURAL, name
    )

    cluster_jobs_track()

    job = _reread(job)
    assert (job.backend_state, job.state) == ("STOPPED", "cancelled") and job.ended_at


def test_the_api_server_down_for_a_pass_is_retried_on_the_next(on_real_server, kuberay, kube):
    job = _reread(cluster_job_handover(on_real_server.pk))
    name = job.backend_job_id.partition("/")[2]
    kuberay.admit(name)
    kuberay.run(name)

    kube.kill_apiserver()
    try:
        assert cluster_jobs_track()["failed"] == 1
        assert _reread(job).state == "queued"  # unchanged: nothing was read
    finally:
        kube.start_apiserver()
    cluster_jobs_track()

    assert (_reread(job).backend_state, _reread(job).state) == ("RUNNING", "running")


@pytest.mark.parametrize("head", [False, True], ids=["worker", "head"])
def test_H8_a_node_lost_under_a_rayjob_is_handed_to_kuberay_again_on_its_infra_budget(
    on_real_server, kuberay, head
):
    """A pod evicted for its node (a worker's, or the head's with the job's supervisor) ends
    the attempt ``infrastructure``: the job is queued again, and once its backoff is past a
    new RayJob is made under a new key; max_attempts: 1 is not spent."""
    from datetime import timedelta

    from placement.models import Attempt

    TrainingJob.objects.filter(pk=on_real_server.pk).update(max_attempts=1)
    job = _reread(cluster_job_handover(on_real_server.pk))
    first = job.backend_job_id.partition("/")[2]
    kuberay.admit(first)
    kuberay.run(first)
    cluster_jobs_track()
    kuberay.lose_node(first, head=head)
    cluster_jobs_track()

    job = _reread(job)
    assert (job.state, job.backend_job_id) == ("queued", "") and job.not_before
    assert Attempt.objects.get(training_job=job).end_class == "infrastructure"
    TrainingJob.objects.filter(pk=job.pk).update(not_before=job.not_before - timedelta(hours=1))
    cluster_jobs_track()  # handed over anew

    job = _reread(job)
    second = job.backend_job_id.partition("/")[2]
    assert second and second != first and second.endswith(job.handover_key)
    assert kuberay.get(first)["status"]["jobStatus"] == "FAILED"  # the failed one is kept
    kuberay.admit(second)
    kuberay.run(second)
    kuberay.finish(second, "SUCCEEDED")
    cluster_jobs_track()
    assert _reread(job).state == "succeeded"
