"""KubeRay jobs against a real Kubernetes API server (tests/kube_apiserver.py): the standalone
apiextensions-apiserver 0.36 and etcd 3.5 from Debian's packages, serving the project's
RayJob CRD (ray.io/v1, KubeRay 1.3's fields), with a stand-in for KubeRay's controller
(tests/kube/kuberay.py) moving each RayJob's status. What the server decides here is the
server's: the schema a manifest must meet, the names and labels it takes, 404s, 409s, 410s,
and its restarts. Ray itself never runs."""

import dataclasses
import json
import threading
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from nodes.backends.base import BackendError, job_state_is_final
from nodes.backends.kubernetes import (
    KEY_LABEL,
    RAY_GROUP,
    RAY_VERSION,
    RAYJOB_PLURAL,
    KubernetesBackend,
    rayjob_manifest,
)
from tests.kube_apiserver import versions
from tests.nodes.kube_backend import KEYED_JOB, SFT_JOB
from tests.nodes.kube_replay import RESPONSES

pytestmark = [pytest.mark.kube, pytest.mark.e2e]


def _name(job_id: str) -> str:
    return job_id.partition("/")[2]


def _stored(api, namespace, name) -> dict:
    return api.get_namespaced_custom_object(RAY_GROUP, RAY_VERSION, namespace, RAYJOB_PLURAL, name)


def _kept(sent, stored, path="") -> list[str]:
    """The paths of what was sent that the server did not keep as sent (pruned, changed)."""
    if isinstance(sent, dict):
        if not isinstance(stored, dict):
            return [path]
        return [
            lost
            for key, value in sent.items()
            for lost in (
                _kept(value, stored[key], f"{path}.{key}") if key in stored else [f"{path}.{key}"]
            )
        ]
    if isinstance(sent, list):
        if not isinstance(stored, list) or len(stored) != len(sent):
            return [path]
        return [lost for i, v in enumerate(sent) for lost in _kept(v, stored[i], f"{path}[{i}]")]
    return [] if sent == stored else [path]


# submit() and resume()


def test_the_rayjob_submit_builds_is_accepted_and_kept_whole_under_the_crds_schema(
    backend, api, namespace
):
    """Strict field validation and the structural schema: every field the console sends is
    one the CRD has, of its type, and the server stores each as sent (nothing pruned)."""
    job_id = backend.submit(SFT_JOB)

    namespace_, name = job_id.split("/")
    assert namespace_ == namespace and name.startswith("llama-sft-7b-") and len(name) == 18
    stored = _stored(api, namespace, name)
    sent = rayjob_manifest(SFT_JOB)
    assert _kept(sent["spec"], stored["spec"]) == []
    assert stored["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "tuneplane"}
    # The CRD's defaults, as KubeRay's own CRD sets them.
    assert (stored["spec"]["submissionMode"], stored["spec"]["backoffLimit"]) == ("K8sJobMode", 0)


def test_a_keyed_rayjob_is_resumed_as_its_own_object_never_a_second(backend, api, namespace):
    job_id = backend.submit(KEYED_JOB)

    assert job_id == f"{namespace}/llama-sft-7b-tp-0123456789ab"
    assert backend.resume(KEYED_JOB) == job_id  # the server's 409 AlreadyExists, then a read
    listed = api.list_namespaced_custom_object(RAY_GROUP, RAY_VERSION, namespace, RAYJOB_PLURAL)
    assert [item["metadata"]["name"] for item in listed["items"]] == [_name(job_id)]
    assert listed["items"][0]["metadata"]["labels"][KEY_LABEL] == "tp-0123456789ab"


def test_an_object_of_the_same_name_that_is_not_this_jobs_is_never_taken_for_it(
    backend, api, namespace
):
    """Someone else's RayJob (no key, or another) with the name this job's key gives."""
    theirs = rayjob_manifest(KEYED_JOB)
    del theirs["metadata"]["labels"][KEY_LABEL]
    api.create_namespaced_custom_object(RAY_GROUP, RAY_VERSION, namespace, RAYJOB_PLURAL, theirs)

    with pytest.raises(BackendError, match="exists .* and is not this job's"):
        backend.resume(KEYED_JOB)


# Names, labels and fields: where the real server draws the line


def _with_name(name: str) -> dict:
    manifest = rayjob_manifest(KEYED_JOB)
    manifest["metadata"]["name"] = name
    return manifest


@pytest.mark.parametrize("length", [47, 63, 253])
def test_a_name_up_to_253_characters_is_taken_by_the_server(backend, length):
    """A custom object's name is a DNS subdomain (253): the API server takes what KubeRay
    refuses (over 47, test_a_name_kuberay_refuses_...), so the backend keeps to 47 itself."""
    name = ".".join(["a" * 63] * (length // 64) + ["b" * (length % 64)])

    assert len(name) == length
    assert backend.create(_with_name(name)) == f"{backend.namespace}/{name}"


@pytest.mark.parametrize(
    "name",
    ["a" * 254, "Llama-sft", "llama_sft", "-llama", "llama-"],
    ids=["254-chars", "upper-case", "underscore", "leading-dash", "trailing-dash"],
)
def test_a_name_the_server_refuses_reaches_the_user_naming_the_field(backend, name):
    with pytest.raises(BackendError) as refused:
        backend.create(_with_name(name))

    message = str(refused.value)
    assert "answered 422 Unprocessable Entity" in message
    assert "metadata.name: Invalid value" in message


def _with_label(key: str, value: str) -> dict:
    manifest = rayjob_manifest(SFT_JOB)
    manifest["metadata"]["labels"][key] = value
    return manifest


@pytest.mark.parametrize(
    "key, value",
    [
        ("kueue.x-k8s.io/queue-name", "a" * 63),
        ("kueue.x-k8s.io/queue-name", ""),
        ("a" * 63, "v"),
        ("example.com/" + "a" * 63, "a-b_c.d"),
    ],
    ids=["value-63", "value-empty", "name-63", "prefixed-name-63"],
)
def test_labels_at_the_limits_are_taken(backend, key, value):
    assert backend.create(_with_label(key, value))


@pytest.mark.parametrize(
    "key, value",
    [
        ("kueue.x-k8s.io/queue-name", "a" * 64),
        ("kueue.x-k8s.io/queue-name", "team/queue"),
        ("kueue.x-k8s.io/queue-name", "-queue"),
        ("a" * 64, "v"),
        ("a/b/c", "v"),
    ],
    ids=["value-64", "value-with-slash", "value-leading-dash", "name-64", "two-slashes"],
)
def test_a_label_the_server_refuses_reaches_the_user_naming_the_field(backend, key, value):
    with pytest.raises(BackendError) as refused:
        backend.create(_with_label(key, value))

    assert "422" in str(refused.value) and "metadata.labels: Invalid value" in str(refused.value)


def test_a_field_the_crd_does_not_have_is_refused_by_name_not_dropped(backend, api, namespace):
    """fieldValidation=Strict: an older KubeRay's CRD lacking a field the console sets refuses
    the manifest, naming the field; by default the server would drop it without a word."""
    manifest = rayjob_manifest(SFT_JOB)
    manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["gpusPerHead"] = 1

    with pytest.raises(BackendError) as refused:
        backend.create(manifest)
    assert 'unknown field "spec.rayClusterSpec.headGroupSpec.gpusPerHead"' in str(refused.value)

    # What the server does without Strict: takes it, and drops the field.
    created = api.create_namespaced_custom_object(
        RAY_GROUP, RAY_VERSION, namespace, RAYJOB_PLURAL, manifest
    )
    assert "gpusPerHead" not in created["spec"]["rayClusterSpec"]["headGroupSpec"]


def test_a_value_of_the_wrong_type_is_refused_naming_its_path(backend):
    manifest = rayjob_manifest(SFT_JOB)
    manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "two"

    with pytest.raises(BackendError) as refused:
        backend.create(manifest)
    assert "spec.rayClusterSpec.workerGroupSpecs[0].replicas: Invalid value" in str(refused.value)


def test_the_largest_job_the_console_can_send_is_taken(backend):
    """Replicas and cards at int32's edge and a script of 256 KiB: the server takes them."""
    job = dataclasses.replace(SFT_JOB, nodes=2**31 - 1, cards=2**31 - 1, script="x" * 262144)
    assert backend.submit(job)


# job_state() through the RayJob's life, moved by the KubeRay stand-in


def test_job_state_follows_the_rayjob_through_its_life(backend, kuberay):
    job_id = backend.submit(SFT_JOB)
    name = _name(job_id)
    assert backend.job_state(job_id) == "PENDING"  # no status yet: KubeRay has not seen it
    kuberay.admit(name)
    assert backend.job_state(job_id) == "PENDING"  # Initializing, jobStatus PENDING
    kuberay.run(name)
    assert backend.job_state(job_id) == "RUNNING"
    kuberay.finish(name, "SUCCEEDED")
    assert backend.job_state(job_id) == "SUCCEEDED"


@pytest.mark.parametrize("ending", ["SUCCEEDED", "FAILED", "STOPPED"])
def test_each_end_of_a_ray_job_is_a_final_state(backend, kuberay, ending):
    job_id = backend.submit(SFT_JOB)
    kuberay.admit(_name(job_id))
    kuberay.run(_name(job_id))
    kuberay.finish(_name(job_id), ending)

    state = backend.job_state(job_id)
    assert state == ending and job_state_is_final(state)


def test_a_rayjob_kuberay_gave_up_on_is_failed_whatever_its_job_status_last_said(backend, kuberay):
    """Past activeDeadlineSeconds: jobDeploymentStatus Failed, jobStatus still RUNNING. Read
    as RUNNING, the job would wait for an end that never comes."""
    job_id = backend.submit(SFT_JOB)
    kuberay.admit(_name(job_id))
    kuberay.run(_name(job_id))
    kuberay.give_up(_name(job_id))

    assert backend.job_state(job_id) == "FAILED"


def test_a_name_kuberay_refuses_is_a_failed_job_not_one_pending_forever(backend, kuberay):
    """The server takes a 48-character name; KubeRay 1.3 refuses it (ValidationFailed) and
    never sets a jobStatus."""
    job_id = backend.create(_with_name("a" * 48))
    kuberay.admit(_name(job_id))

    assert backend.job_state(job_id) == "FAILED"


# cancel(), and objects gone


def test_cancel_of_a_running_job_is_read_back_stopped_once_kuberay_lets_it_go(
    backend, kuberay, api, namespace
):
    job_id = backend.submit(SFT_JOB)
    kuberay.admit(_name(job_id))
    kuberay.run(_name(job_id))

    backend.cancel(job_id)
    # KubeRay's finalizer holds the object while it stops the Ray job: still running.
    held = _stored(api, namespace, _name(job_id))
    assert held["metadata"]["deletionTimestamp"]
    assert backend.job_state(job_id) == "RUNNING"
    backend.cancel(job_id)  # asked again (a retried pass): done, no error
    kuberay.reap(_name(job_id))

    assert backend.job_state(job_id) == "STOPPED"
    backend.cancel(job_id)  # gone: done


@pytest.mark.parametrize("ending", ["SUCCEEDED", "FAILED", "STOPPED"])
def test_cancel_of_a_finished_job_is_done_and_its_end_was_read_first(backend, kuberay, ending):
    job_id = backend.submit(SFT_JOB)
    kuberay.admit(_name(job_id))
    kuberay.finish(_name(job_id), ending)
    assert backend.job_state(job_id) == ending

    backend.cancel(job_id)
    kuberay.reap(_name(job_id))
    assert job_state_is_final(backend.job_state(job_id))


def test_a_rayjob_deleted_behind_the_consoles_back_is_stopped_not_an_error_forever(
    backend, api, namespace
):
    """Before the fix the 404 was a BackendError at every pass: the job never ended."""
    job_id = backend.submit(SFT_JOB)
    api.delete_namespaced_custom_object(
        RAY_GROUP, RAY_VERSION, namespace, RAYJOB_PLURAL, _name(job_id)
    )

    assert backend.job_state(job_id) == "STOPPED"
    backend.cancel(job_id)


def test_a_404_for_rayjobs_not_served_is_an_error_not_a_stopped_job(backend, kube, monkeypatch):
    """A cluster that serves no ray.io/v1 RayJobs (KubeRay's CRD missing, a KubeRay before
    1.0 serving only v1alpha1, or an API server just restarted that has not read its CRDs
    again): the server's 404 names no object, says nothing of the job, and is retried, never
    taken for the job's end."""
    from nodes.backends import kubernetes

    job_id = backend.submit(SFT_JOB)
    monkeypatch.setattr(kubernetes, "RAY_VERSION", "v1alpha1")

    with pytest.raises(BackendError, match="answered 404"):
        backend.job_state(job_id)


# Conflicts, compaction, restarts


def test_a_stale_resource_version_is_refused_409_and_the_console_never_writes_one(
    backend, kuberay, api, namespace
):
    """The API server's optimistic concurrency: an update naming a resourceVersion it has
    moved past answers 409 Conflict. Only KubeRay updates a RayJob (and reads again on 409,
    as the stand-in does); the console creates, reads and deletes, none of which names a
    resourceVersion, so a 409 never reaches its cancel."""
    job_id = backend.submit(SFT_JOB)
    name = _name(job_id)
    stale = _stored(api, namespace, name)
    kuberay.admit(name)

    stale["status"] = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}
    with pytest.raises(ApiException) as conflict:
        api.replace_namespaced_custom_object_status(
            RAY_GROUP, RAY_VERSION, namespace, RAYJOB_PLURAL, name, stale
        )
    assert conflict.value.status == 409 and "the object has been modified" in conflict.value.body
    assert backend.job_state(job_id) == "PENDING"  # the stale write changed nothing

    racing = threading.Thread(target=lambda: [kuberay.run(name) for _ in range(20)])
    racing.start()
    backend.cancel(job_id)  # while KubeRay writes: a delete carries no resourceVersion
    racing.join()
    kuberay.reap(name)
    assert backend.job_state(job_id) == "STOPPED"


def _many(backend, count) -> set[str]:
    return {backend.submit(dataclasses.replace(SFT_JOB, name=f"job {i}")) for i in range(count)}


def _jobs_in_every_state(backend, kuberay) -> dict[str, str]:
    """A RayJob in each state the console reads, by id, with the state job_state() reads."""
    moves = {
        "fresh": [],
        "admitted": [kuberay.admit],
        "running": [kuberay.admit, kuberay.run],
        "succeeded": [kuberay.admit, kuberay.run, lambda n: kuberay.finish(n, "SUCCEEDED")],
        "failed": [kuberay.admit, kuberay.run, lambda n: kuberay.finish(n, "FAILED")],
        "stopped": [kuberay.admit, kuberay.run, lambda n: kuberay.finish(n, "STOPPED")],
        "gave up": [kuberay.admit, kuberay.run, kuberay.give_up],
    }
    expected = {}
    for name, steps in moves.items():
        job_id = backend.submit(dataclasses.replace(SFT_JOB, name=name))
        for step in steps:
            step(_name(job_id))
        expected[job_id] = backend.job_state(job_id)
    assert set(expected.values()) == {"PENDING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED"}
    return expected


def test_job_states_reads_each_rayjob_as_job_state_does(backend, kuberay, api, namespace):
    """From KubeRay's printer columns (a Table), the same words as from the objects; RayJobs
    the console did not make (no managed-by label) are not listed."""
    expected = _jobs_in_every_state(backend, kuberay)
    theirs = rayjob_manifest(SFT_JOB)
    theirs["metadata"]["labels"] = {"team": "theirs"}
    api.create_namespaced_custom_object(RAY_GROUP, RAY_VERSION, namespace, RAYJOB_PLURAL, theirs)

    assert backend.job_states() == expected


def test_job_states_without_kuberays_columns_reads_the_objects(backend, kuberay, monkeypatch):
    """A RayJob CRD whose printer columns are not KubeRay's: the whole objects are read."""
    from nodes.backends import kubernetes

    expected = _jobs_in_every_state(backend, kuberay)
    monkeypatch.setattr(kubernetes, "STATE_COLUMNS", ("job state", "deployment status"))
    tables = []
    original = KubernetesBackend._list_page

    def listed(self, client, token, table):
        tables.append(table)
        return original(self, client, token, table)

    monkeypatch.setattr(KubernetesBackend, "_list_page", listed)

    assert backend.job_states() == expected
    assert tables == [True, False]


def test_a_paged_list_continued_past_compaction_is_begun_again_not_cut_short(
    backend, kube, monkeypatch
):
    """The API server answers 410 Gone to a continue token older than etcd's compaction
    when its watch cache no longer has the list's snapshot (here it is restarted; in a
    cluster, the next page may be answered by another API server replica, or come after the
    cache moved on): the list is read again from its start, whole and consistent (the
    RayJob made meanwhile is in it)."""
    from nodes.backends import kubernetes

    monkeypatch.setattr(kubernetes, "LIST_PAGE", 3)
    made = _many(backend, 7)
    pages, gone = [], []
    original = KubernetesBackend._list_page

    def list_then_compact(self, client, token, table):
        try:
            page = original(self, client, token, table)
        except ApiException as error:
            gone.append(error.status)
            raise
        pages.append(token)
        if len(pages) == 1:  # after the first page: a write, compaction, a cache emptied
            made.add(backend.submit(dataclasses.replace(SFT_JOB, name="made meanwhile")))
            kube.compact()
            kube.restart_apiserver()
        return page

    monkeypatch.setattr(KubernetesBackend, "_list_page", list_then_compact)

    states = backend.job_states()

    assert gone == [410]
    assert set(states) == made and set(states.values()) == {"PENDING"}


def test_a_continue_token_past_compaction_is_410_expired(backend, kube, api, namespace):
    """The server's own answer, which job_states() meets (above). Right after compaction
    the token still works: the watch cache (Kubernetes 1.36) serves the next page from its
    snapshot of the list. Without that snapshot (a restarted server, another replica) the
    page is read from etcd, which no longer has the list's revision: 410 Expired."""
    _many(backend, 3)
    first = api.list_namespaced_custom_object(
        RAY_GROUP, RAY_VERSION, namespace, RAYJOB_PLURAL, limit=1
    )
    backend.submit(SFT_JOB)
    kube.compact()
    second = api.list_namespaced_custom_object(
        RAY_GROUP,
        RAY_VERSION,
        namespace,
        RAYJOB_PLURAL,
        limit=1,
        _continue=first["metadata"]["continue"],
    )
    assert len(second["items"]) == 1
    kube.restart_apiserver()

    with pytest.raises(ApiException) as gone:
        api.list_namespaced_custom_object(
            RAY_GROUP,
            RAY_VERSION,
            namespace,
            RAYJOB_PLURAL,
            limit=1,
            _continue=first["metadata"]["continue"],
        )
    assert gone.value.status == 410 and '"reason":"Expired"' in gone.value.body


def test_the_api_server_down_and_back_is_retried_never_a_wrong_end(backend, kube, kuberay):
    """Killed, then started again: while it is down a read is a BackendError (the tracking
    pass tries again); once back, and while it reads its CRDs again, every answer is the
    job's true state or an error — never STOPPED for a job that runs."""
    job_id = backend.submit(SFT_JOB)
    kuberay.admit(_name(job_id))
    kuberay.run(_name(job_id))

    kube.kill_apiserver()
    with pytest.raises(BackendError, match="did not answer"):
        backend.job_state(job_id)
    with pytest.raises(BackendError, match="did not answer"):
        backend.cancel(job_id)

    outcomes, stop = [], threading.Event()

    def read_until_running():
        while not stop.is_set():
            try:
                state = backend.job_state(job_id)
            except BackendError as error:
                outcomes.append(type(error).__name__)
                continue
            outcomes.append(state)
            if state == "RUNNING":
                return

    reader = threading.Thread(target=read_until_running)
    reader.start()
    try:
        kube.start_apiserver()
        reader.join(30)
    finally:
        stop.set()
        reader.join()

    assert outcomes[-1] == "RUNNING"
    # Refused connections, then (its storage re-initializing) 429s and 404s naming no
    # object: errors, each retried.
    assert set(outcomes) <= {"RUNNING", "BackendError", "OutcomeUnknown"}


def test_a_paged_list_across_a_restart_is_whole_or_an_error(backend, kube, monkeypatch):
    """The server killed between two pages of job_states(): the next page is an error (the
    pass is retried), never a list cut short that would read as jobs gone."""
    from nodes.backends import kubernetes

    monkeypatch.setattr(kubernetes, "LIST_PAGE", 2)
    made = _many(backend, 5)
    original = KubernetesBackend._list_page
    calls = []

    def list_then_kill(self, client, token, table):
        calls.append(token)
        page = original(self, client, token, table)
        if len(calls) == 1:
            kube.kill_apiserver()
        return page

    monkeypatch.setattr(KubernetesBackend, "_list_page", list_then_kill)
    try:
        with pytest.raises(BackendError, match="did not answer"):
            backend.job_states()
    finally:
        kube.start_apiserver()
    monkeypatch.setattr(KubernetesBackend, "_list_page", original)

    assert set(backend.job_states()) == made


def test_a_job_id_of_another_form_is_refused_before_any_call():
    backend = KubernetesBackend.from_config(
        {"kube_api_url": "https://127.0.0.1:1", "kuberay_namespace": "ml-jobs"}
    )
    with pytest.raises(BackendError, match="not a RayJob id"):
        backend.job_state("no-namespace")


@pytest.mark.parametrize("fixture", ["rayjob-created.json", "rayjob-running.json"])
def test_the_replays_rayjobs_are_ones_the_crd_takes_whole(api, namespace, fixture):
    """tests/nodes/kube_responses' RayJobs, which the replayed tests decode, are objects the
    real server takes under the CRD's schema with strict field validation — spec and status
    — and keeps as they are."""
    replayed = json.loads((RESPONSES / fixture).read_text())
    metadata = replayed["metadata"]
    manifest = {
        "apiVersion": replayed["apiVersion"],
        "kind": replayed["kind"],
        "metadata": {"name": metadata["name"], "labels": metadata["labels"]},
        "spec": replayed["spec"],
    }
    created = api.create_namespaced_custom_object(
        RAY_GROUP, RAY_VERSION, namespace, RAYJOB_PLURAL, manifest, field_validation="Strict"
    )
    assert _kept(replayed["spec"], created["spec"]) == []
    if "status" in replayed:
        created["status"] = replayed["status"]
        moved = api.replace_namespaced_custom_object_status(
            RAY_GROUP,
            RAY_VERSION,
            namespace,
            RAYJOB_PLURAL,
            metadata["name"],
            created,
            field_validation="Strict",
        )
        assert _kept(replayed["status"], moved["status"]) == []


def test_the_versions_proven_against_are_the_ones_the_operators_guide_names(kube):
    """Debian unstable moves on: a chroot built from newer packages is named in the guide
    before its tests stand as proof of it."""
    guide = (Path(__file__).parents[2] / "docs" / "operator" / "fleets.md").read_text()
    built = versions(kube.root)
    for package in ("golang-k8s-apiextensions-apiserver-dev", "etcd-server"):
        upstream = built[package].split(":")[-1].split("-")[0]
        assert f"**{upstream}**" in guide, f"{package} {built[package]}"
