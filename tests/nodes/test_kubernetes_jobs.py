"""KubeRay jobs: submitted, resumed and read back, against REPLAYED responses
(tests/nodes/kube_replay.py), as tests/nodes/test_kubernetes_backend.py is.

``KubeReplay`` serves stored responses in the Kubernetes API's own formats to the official
client, so what is proved here is our mapping, our requests and our error messages; that a
real server answers the same way is proven for RayJobs by tests/kube, against a real
apiextensions-apiserver and etcd (its schema, names and labels, 404, 409, 410, restarts).
"""

import dataclasses
import json
import re

import pytest

from nodes.backends.base import BackendError, OutcomeUnknown
from nodes.backends.kubernetes import KubernetesBackend, rayjob_name_prefix, rayjob_naming

from .kube_backend import (  # noqa: F401 -- no_proxy: an autouse fixture
    H100,
    KEYED_JOB,
    NODES,
    RAYJOB,
    RAYJOBS,
    SFT_JOB,
    SHORT_TIMEOUT,
    TOKEN,
    TOKEN_ENV,
    backend_at,
    free_port,
    no_proxy,
    replay_file,
)
from .kube_replay import KubeReplay


@pytest.fixture
def replay():
    """A replayed API that serves nothing until the test says what."""
    with KubeReplay() as server:
        yield server


# Jobs


def test_submit_creates_a_rayjob_in_the_kuberay_namespace(replay):
    replay.serve("POST", RAYJOBS, "rayjob-created.json", status=201)

    job_id = backend_at(replay.url).submit(SFT_JOB)

    assert job_id == "ml-jobs/llama-sft-7b-x9k2p"
    [sent] = replay.requests
    assert (sent.method, sent.path) == ("POST", RAYJOBS)
    assert (sent.body["apiVersion"], sent.body["kind"]) == ("ray.io/v1", "RayJob")
    assert sent.body["metadata"]["generateName"] == "llama-sft-7b-"
    spec = sent.body["spec"]
    assert spec["entrypoint"] == "python train.py --epochs 3"
    [workers] = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert workers["replicas"] == 2
    pod = workers["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": H100}
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 8}
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert "resources" not in head


def test_a_job_for_any_series_has_no_node_selector(replay):
    replay.serve("POST", RAYJOBS, "rayjob-created.json", status=201)

    backend_at(replay.url).submit(dataclasses.replace(SFT_JOB, series=""))

    [workers] = replay.requests[-1].body["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert "nodeSelector" not in workers["template"]["spec"]


ALREADY_EXISTS = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "code": 409,
    "reason": "AlreadyExists",
    "message": 'rayjobs.ray.io "llama-sft-7b-tp-0123456789ab" already exists',
}


def test_a_keyed_job_has_a_rayjob_name_of_its_own(replay):
    replay.serve("POST", RAYJOBS, "rayjob-created.json", status=201)

    backend_at(replay.url).submit(KEYED_JOB)

    metadata = replay.requests[-1].body["metadata"]
    assert metadata["name"] == "llama-sft-7b-tp-0123456789ab"
    assert "generateName" not in metadata


KEYED_RAYJOB = f"{RAYJOBS}/llama-sft-7b-tp-0123456789ab"


def _keyed_rayjob(key: str) -> dict:
    rayjob = json.loads(replay_file("rayjob-created.json"))
    rayjob["metadata"]["name"] = "llama-sft-7b-tp-0123456789ab"
    rayjob["metadata"]["labels"]["tuneplane.io/handover-key"] = key
    return rayjob


def test_resuming_a_handover_the_cluster_already_took_returns_that_rayjob(replay):
    """The console stopped after KubeRay took the job and before it recorded the answer:
    creating the same name again answers 409, the object of that name carries this job's
    key, and no second RayJob exists."""
    replay.serve("POST", RAYJOBS, ALREADY_EXISTS, status=409)
    replay.serve("GET", KEYED_RAYJOB, _keyed_rayjob("tp-0123456789ab"))

    assert backend_at(replay.url).resume(KEYED_JOB) == "ml-jobs/llama-sft-7b-tp-0123456789ab"


def test_a_rayjob_of_the_same_name_with_another_key_is_not_taken_for_this_job(replay):
    replay.serve("POST", RAYJOBS, ALREADY_EXISTS, status=409)
    replay.serve("GET", KEYED_RAYJOB, _keyed_rayjob("tp-ffffffffffff"))

    with pytest.raises(BackendError, match="is not this job's"):
        backend_at(replay.url).resume(KEYED_JOB)


def test_a_409_for_an_unkeyed_job_is_an_error(replay):
    replay.serve("POST", RAYJOBS, ALREADY_EXISTS, status=409)

    with pytest.raises(BackendError, match="409"):
        backend_at(replay.url).submit(SFT_JOB)


@pytest.mark.parametrize("job_name", ["Llama SFT 7B", "x" * 80, "7b/eval: run #2", ""])
def test_keyed_rayjob_names_are_dns_labels_within_kuberays_limit(job_name):
    name = rayjob_naming(dataclasses.replace(KEYED_JOB, name=job_name))["name"]

    assert len(name) <= 47 and name.endswith("-tp-0123456789ab") and name[0].isalpha()
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name)


def test_submit_without_a_kuberay_namespace_sends_nothing(replay):
    backend = KubernetesBackend.from_config({"kube_api_url": replay.url})

    with pytest.raises(BackendError, match="config.kuberay_namespace is not set"):
        backend.submit(SFT_JOB)
    assert replay.requests == []


@pytest.mark.parametrize(
    "job_name, prefix",
    [
        ("Llama SFT 7B", "llama-sft-7b-"),
        ("7b/eval: run #2", "job-7b-eval-run-2-"),
        ("", "job-"),
        ("x" * 80, "x" * 41 + "-"),
    ],
)
def test_rayjob_names_are_dns_labels_kuberay_accepts(job_name, prefix):
    assert rayjob_name_prefix(job_name) == prefix


def test_job_state_is_the_rayjobs_job_status(replay):
    replay.serve("GET", RAYJOB, "rayjob-running.json")

    assert backend_at(replay.url).job_state("ml-jobs/llama-sft-7b-x9k2p") == "RUNNING"
    assert replay.requests[-1].path == RAYJOB


@pytest.mark.parametrize(
    "status, state",
    [
        (None, "PENDING"),
        ({"jobDeploymentStatus": "Initializing"}, "Initializing"),
    ],
)
def test_job_state_before_the_job_runs(replay, status, state):
    rayjob = json.loads(replay_file("rayjob-created.json"))
    if status:
        rayjob["status"] = status
    replay.serve("GET", RAYJOB, rayjob)

    assert backend_at(replay.url).job_state("ml-jobs/llama-sft-7b-x9k2p") == state


def test_job_state_where_rayjobs_are_not_served_is_a_backend_error(replay):
    """A 404 naming no object (KubeRay's CRD missing): an error, retried; a RayJob that is
    gone (a 404 naming it) is STOPPED, proven against the real server in tests/kube."""
    with pytest.raises(BackendError, match="404"):
        backend_at(replay.url).job_state("ml-jobs/llama-sft-7b-x9k2p")


# Config


def test_a_config_without_url_or_context_names_both_keys():
    with pytest.raises(BackendError, match="config.kube_api_url or config.kube_context"):
        KubernetesBackend.from_config({"kuberay_namespace": "ml-jobs"})


def test_a_config_with_both_url_and_context_is_refused():
    with pytest.raises(BackendError, match="not both"):
        KubernetesBackend.from_config(
            {"kube_api_url": "https://k8s.example:6443", "kube_context": "lab"}
        )


def test_job_state_of_a_rayjob_that_is_gone_is_stopped(replay):
    """The API server's 404 for the object itself names it in its Status (as a real one
    does: tests/kube): the RayJob was deleted, and its job is over."""
    gone = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": 'rayjobs.ray.io "llama-sft-7b-x9k2p" not found',
        "reason": "NotFound",
        "details": {"name": "llama-sft-7b-x9k2p", "group": "ray.io", "kind": "rayjobs"},
        "code": 404,
    }
    replay.serve("GET", RAYJOB, gone, status=404)

    assert backend_at(replay.url).job_state("ml-jobs/llama-sft-7b-x9k2p") == "STOPPED"


@pytest.mark.parametrize("deployment", ["Failed", "ValidationFailed"])
def test_job_state_of_a_rayjob_kuberay_gave_up_on_is_failed(replay, deployment):
    rayjob = json.loads(replay_file("rayjob-running.json"))
    rayjob["status"]["jobDeploymentStatus"] = deployment

    replay.serve("GET", RAYJOB, rayjob)

    assert backend_at(replay.url).job_state("ml-jobs/llama-sft-7b-x9k2p") == "FAILED"


@pytest.mark.parametrize("status", [429, 503])
def test_an_api_server_that_says_not_now_leaves_the_handover_to_be_resumed(replay, status):
    """A real API server answers 429 "storage is (re)initializing" while it starts again
    (seen in tests/kube): the job is not refused, and its handover is resumed next pass."""
    later = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": "storage is (re)initializing",
        "reason": "TooManyRequests",
        "details": {"retryAfterSeconds": 1},
        "code": status,
    }
    replay.serve("POST", RAYJOBS, later, status=status)

    with pytest.raises(OutcomeUnknown, match=f"answered {status} .*storage is"):
        backend_at(replay.url).submit(KEYED_JOB)
