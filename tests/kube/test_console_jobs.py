"""The console's own tracking (placement/handover.py) of a job on a Kubernetes Fleet, against
the real API server: handed over, read back as KubeRay moves it, cancelled (R10), its RayJob
deleted behind the console's back, the API server down for a pass — each ends in a clear
state or is retried on the next pass, never a job left waiting for ever. A pass reads a
Fleet's jobs with one paged list of its RayJobs, and a job alone only where the list cannot
answer for it (counted here at the client: every request it sends).

The Fleet's nodes are read once from the replay (a node list needs the full kube-apiserver);
its config is then pointed at the real server for the jobs."""

from urllib.parse import urlsplit

import pytest
from django.test import TestCase
from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import RESTClientObject

from audit.services import Actor
from nodes.backends import kubernetes
from nodes.backends.kubernetes import RAY_GROUP, RAY_VERSION, RAYJOB_PLURAL, KubernetesBackend
from placement.handover import cluster_job_handover, cluster_jobs_track
from placement.models import Attempt, TrainingJob
from placement.services.submission import training_job_submit
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


# One list a pass

MANY = 50


@pytest.fixture
def api_calls(monkeypatch):
    """Every request a Kubernetes client sends, as (method, path): the console's, and the
    KubeRay stand-in's (cleared before what is counted)."""
    sent = []
    original = RESTClientObject.request

    def request(self, method, url, *args, **kwargs):
        sent.append((method, urlsplit(url).path))
        return original(self, method, url, *args, **kwargs)

    monkeypatch.setattr(RESTClientObject, "request", request)
    return sent


def _handed_over(first, world, count: int) -> list[TrainingJob]:
    """``count`` jobs on the Fleet of ``first``, handed over by one pass, max_attempts 1."""
    more = [
        training_job_submit(
            actor=Actor.of_user(world.member), project="ml", name="sft", cards=1, script="x"
        )
        for _ in range(count - 1)
    ]
    jobs = [first, *more]
    TrainingJob.objects.filter(pk__in=[job.pk for job in jobs]).update(max_attempts=1)
    cluster_jobs_track()
    jobs = [_reread(job) for job in jobs]
    assert all(job.backend_job_id for job in jobs)
    return jobs


def _counted_pass(api_calls) -> list[tuple[str, str]]:
    api_calls.clear()
    cluster_jobs_track()
    return list(api_calls)


def _list_path(namespace: str) -> str:
    return f"/apis/{RAY_GROUP}/{RAY_VERSION}/namespaces/{namespace}/{RAYJOB_PLURAL}"


def test_a_pass_over_50_jobs_reads_them_with_one_list_as_kuberay_moves_them(
    on_real_server, world, kuberay, api, api_calls
):
    """Before, one GET per job per pass (50). Now one list; a job read alone only where the
    list cannot answer: listed FAILED (its class, H8, is in KubeRay's reason and message,
    which the list's columns lack) or not listed (deleted behind the console's back)."""
    jobs = _handed_over(on_real_server, world, MANY)
    names = [job.backend_job_id.partition("/")[2] for job in jobs]
    listed = _list_path(kuberay.namespace)
    for name in names:
        kuberay.admit(name)
        kuberay.run(name)

    assert _counted_pass(api_calls) == [("GET", listed)]
    assert {_reread(job).state for job in jobs} == {"running"}

    for i, name in enumerate(names):
        if 10 <= i < 20:
            kuberay.finish(name, "SUCCEEDED")
        elif 20 <= i < 30:
            kuberay.finish(name, "FAILED")  # its own app: AppFailed
        elif 30 <= i < 40:
            kuberay.lose_node(name, head=i % 2 == 0)
        elif 40 <= i < 45:
            kuberay.reap(name)
            api.delete_namespaced_custom_object(
                RAY_GROUP, RAY_VERSION, kuberay.namespace, RAYJOB_PLURAL, name
            )
        elif i >= 45:
            kuberay.finish(name, "STOPPED")

    calls = _counted_pass(api_calls)

    assert calls == [("GET", listed)] + [("GET", f"{listed}/{name}") for name in names[20:45]]
    states = [(_reread(job).state, _reread(job).backend_state) for job in jobs]
    assert states == (
        [("running", "RUNNING")] * 10
        + [("succeeded", "SUCCEEDED")] * 10
        + [("failed", "FAILED")] * 10
        + [("queued", "FAILED")] * 10  # H8: a node lost, handed over anew after its backoff
        + [("cancelled", "STOPPED")] * 10
    )
    assert {_reread(job).backend_job_id for job in jobs[30:40]} == {""}
    ends = {job.pk: Attempt.objects.get(training_job=job).end_class for job in jobs[20:40]}
    assert [ends[job.pk] for job in jobs[20:40]] == ["user"] * 10 + ["infrastructure"] * 10

    assert _counted_pass(api_calls) == [("GET", listed)]  # nothing moved: the list alone


def test_a_pass_whose_list_is_continued_past_compaction_begins_it_again(
    on_real_server, world, kuberay, kube, api_calls, monkeypatch
):
    """410 mid-list in a pass: after its first page a job ends, etcd is compacted and the
    API server restarted (its watch cache gone), so the next page is 410 Expired. The list
    is begun again and read whole, the job's end in it; no job is read alone."""
    monkeypatch.setattr(kubernetes, "LIST_PAGE", 3)
    jobs = _handed_over(on_real_server, world, 7)
    for job in jobs:
        kuberay.admit(job.backend_job_id.partition("/")[2])
        kuberay.run(job.backend_job_id.partition("/")[2])
    pages, gone, ended = [], [], []
    original = KubernetesBackend._list_page

    def list_then_compact(self, client, token, table):
        try:
            page = original(self, client, token, table)
        except ApiException as error:
            gone.append(error.status)
            raise
        pages.append(token)
        if len(pages) == 1:
            theirs = len(api_calls)  # KubeRay's requests, not the console's
            ended.append(page["rows"][0]["cells"][0])
            kuberay.finish(ended[0], "SUCCEEDED")
            kube.compact()
            kube.restart_apiserver()
            del api_calls[theirs:]
        return page

    monkeypatch.setattr(KubernetesBackend, "_list_page", list_then_compact)

    calls = _counted_pass(api_calls)

    assert gone == [410] and len(pages) == 1 + 3  # the first page, then all three again
    assert calls == [("GET", _list_path(kuberay.namespace))] * (1 + 1 + 3)  # the 410 too
    states = {job.backend_job_id.partition("/")[2]: _reread(job).state for job in jobs}
    assert states.pop(ended[0]) == "succeeded"
    assert set(states.values()) == {"running"}
