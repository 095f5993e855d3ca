"""A Kubernetes Fleet: nodes read through the official client, jobs handed to KubeRay.

Every call builds its own client from the Fleet's config, so a kubeconfig context never touches
the process-wide default configuration and a bearer token is read when it is used: it lives on
that call's client only, never on the backend (whose repr may reach a log) nor in a message.
"""

import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass

import urllib3
from kubernetes.client import ApiClient, Configuration, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from kubernetes.config import ConfigException, new_client_from_config

from ..choices import SchedulingState
from .base import BackendError, JobRead, JobSpec, Machine, OutcomeUnknown, job_state_is_final
from .credentials import read_token

REQUEST_TIMEOUT = (3.0, 10.0)  # (connect, read) seconds: a dead API server fails a read fast
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # GPU feature discovery's name for the card
CORDON_REASON = "unschedulable in Kubernetes (cordoned outside the console)"

RAY_GROUP, RAY_VERSION, RAYJOB_PLURAL = "ray.io", "v1", "rayjobs"
RAY_IMAGE_TAG = "2.45.0"
# KubeRay refuses a RayJob name over 47 characters; generateName appends 5 more.
RAYJOB_NAME_MAX = 47
RAYJOB_PREFIX_MAX = RAYJOB_NAME_MAX - 5
MANAGED_BY = {"app.kubernetes.io/managed-by": "tuneplane"}
# A keyed RayJob carries its key, so that resume() tells its own object from another of the
# same name.
KEY_LABEL = "tuneplane.io/handover-key"
# KubeRay's jobDeploymentStatus for a RayJob it gave up on, whatever its jobStatus last said
# (a stale RUNNING, or none): past activeDeadlineSeconds or backoffLimit ("Failed"), or refused
# by its own validation, e.g. a name over 47 characters ("ValidationFailed", KubeRay 1.3).
DEPLOYMENT_FAILED = frozenset({"Failed", "ValidationFailed"})
# A RayJob the API server no longer has: deleted (by cancel(), or behind the console's back).
# KubeRay's finalizer stops a deleted RayJob's Ray job before it lets the object go, so it
# ended as KubeRay's STOPPED does; it is never read again.
GONE = "STOPPED"
# Pages of a RayJob list: the API server's limit/continue.
LIST_PAGE = 500
MANAGED_BY_SELECTOR = ",".join(f"{label}={value}" for label, value in MANAGED_BY.items())
# A list as a Table of the CRD's printer columns (as kubectl get asks), JSON if not served;
# KubeRay's RayJob CRD has these two (with ray cluster name, start time, end time, age).
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io, application/json"
STATE_COLUMNS = ("job status", "deployment status")
LIST_RESTARTS = 3  # a list whose continue token expired (410) is begun again, this often
# "Not now": 429 (an API server whose storage is re-initializing after a restart says
# "storage is (re)initializing", with Retry-After; its priority and fairness, too many
# requests) and 503. Never a refusal of the request: a handover is resumed on the next pass
# under the same key (OutcomeUnknown), not failed.
LATER = frozenset({429, 503})


@dataclass(frozen=True)
class KubernetesBackend:
    """One Kubernetes cluster, reached by API URL (and bearer token) or by kubeconfig context."""

    api_url: str = ""
    context: str = ""
    namespace: str = ""  # KubeRay's; only submit needs it
    token_env: str = ""  # names where the token is, never the token
    token_file: str = ""
    timeout: tuple[float, float] = REQUEST_TIMEOUT

    @classmethod
    def from_config(cls, config: dict) -> "KubernetesBackend":
        api_url, context = config.get("kube_api_url", ""), config.get("kube_context", "")
        if not api_url and not context:
            raise BackendError("config.kube_api_url or config.kube_context must be set")
        if api_url and context:
            raise BackendError("set config.kube_api_url or config.kube_context, not both")
        return cls(
            api_url=api_url.rstrip("/"),
            context=context,
            namespace=config.get("kuberay_namespace", ""),
            token_env=config.get("kube_token_env", ""),
            token_file=config.get("kube_token_file", ""),
        )

    def read(self) -> list[Machine]:
        with self._client() as client:
            try:
                nodes = CoreV1Api(client).list_node(_request_timeout=self.timeout)
            except ValueError as error:  # the client checks required fields as it decodes
                raise BackendError(
                    f"Kubernetes API at {client.configuration.host} sent a node "
                    f"list the client cannot read: {error}"
                ) from error
        return [machine_from_node(node) for node in nodes.items]

    def submit(self, job: JobSpec) -> str:
        return self.create(rayjob_manifest(job))

    def create(self, manifest: dict) -> str:
        """Create a RayJob from ``manifest`` in the KubeRay namespace; its id.

        Strict field validation: a field the cluster's RayJob CRD does not have (an older
        KubeRay's) is refused by name rather than silently dropped. A keyed RayJob that
        exists already (409 AlreadyExists) is this job handed over before, if it carries
        this job's key."""
        if not self.namespace:
            raise BackendError("config.kuberay_namespace is not set")
        with self._client() as client:
            api = CustomObjectsApi(client)
            try:
                created = api.create_namespaced_custom_object(
                    RAY_GROUP,
                    RAY_VERSION,
                    self.namespace,
                    RAYJOB_PLURAL,
                    manifest,
                    field_validation="Strict",
                    _request_timeout=self.timeout,
                )
            except ApiException as error:
                name = manifest["metadata"].get("name")
                if error.status == 409 and name and _reason(error) == "AlreadyExists":
                    return self._handed_over(api, manifest)
                raise
        return f"{self.namespace}/{created['metadata']['name']}"

    def _handed_over(self, api: CustomObjectsApi, manifest: dict) -> str:
        """The id of the RayJob named as ``manifest``, if it is this job's (its key label
        says so); another's of the same name is an error, never taken as ours."""
        name = manifest["metadata"]["name"]
        key = manifest["metadata"].get("labels", {}).get(KEY_LABEL)
        existing = api.get_namespaced_custom_object(
            RAY_GROUP,
            RAY_VERSION,
            self.namespace,
            RAYJOB_PLURAL,
            name,
            _request_timeout=self.timeout,
        )
        if (existing["metadata"].get("labels") or {}).get(KEY_LABEL) != key:
            raise BackendError(
                f"a RayJob named {name!r} exists in namespace {self.namespace!r} and is "
                f"not this job's (its {KEY_LABEL} label is not {key!r})"
            )
        return f"{self.namespace}/{name}"

    def resume(self, job: JobSpec) -> str:
        """A keyed RayJob has a name of its own: creating it again answers 409, and the
        object of that name carrying this job's key is the job already handed over."""
        return self.submit(job)

    def job_state(self, job_id: str) -> str:
        return self.job_read(job_id).state

    def job_read(self, job_id: str) -> JobRead:
        """KubeRay's jobStatus (RUNNING, SUCCEEDED, FAILED, STOPPED ...), else its
        jobDeploymentStatus (Initializing ...), else PENDING; FAILED for a RayJob KubeRay gave
        up on (DEPLOYMENT_FAILED); STOPPED for one the API server no longer has (GONE)."""
        namespace, name = _rayjob_id(job_id)
        with self._client() as client:
            try:
                rayjob = CustomObjectsApi(client).get_namespaced_custom_object(
                    RAY_GROUP,
                    RAY_VERSION,
                    namespace,
                    RAYJOB_PLURAL,
                    name,
                    _request_timeout=self.timeout,
                )
            except ApiException as error:
                if object_not_found(error, name):
                    return JobRead(GONE)
                raise
        return rayjob_read(rayjob)

    def job_states(self) -> dict[str, str]:
        """Every RayJob of the console's in the KubeRay namespace, by id, with its state as
        ``job_state`` reads it: one list in pages (limit/continue) rather than a read per
        job, of KubeRay's printer columns only (the Table ``kubectl get`` reads), not whole
        objects with their scripts. A list whose continue token the API server no longer
        honours (410: etcd compacted past it) is begun again, never continued from a gap."""
        if not self.namespace:
            raise BackendError("config.kuberay_namespace is not set")
        with self._client() as client:
            for attempt in range(LIST_RESTARTS + 1):
                try:
                    return self._list_states(client)
                except ApiException as error:
                    if error.status != 410 or attempt == LIST_RESTARTS:
                        raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _list_states(self, client: ApiClient) -> dict[str, str]:
        states, token, table = {}, "", True
        while True:
            page = self._list_page(client, token, table)
            if page.get("kind") == "Table":
                columns = [column["name"] for column in page["columnDefinitions"]]
                if not set(STATE_COLUMNS) <= set(columns):
                    # A RayJob CRD without KubeRay's columns: whole objects, from the start.
                    states, token, table = {}, "", False
                    continue
                name, job, deployment = (columns.index(c) for c in ("Name", *STATE_COLUMNS))
                found = (
                    (
                        row["cells"][name],
                        {
                            "jobStatus": row["cells"][job] or None,
                            "jobDeploymentStatus": row["cells"][deployment] or None,
                        },
                    )
                    for row in page["rows"]
                )
            else:
                found = (
                    (item["metadata"]["name"], item.get("status") or {}) for item in page["items"]
                )
            for rayjob, status in found:
                states[f"{self.namespace}/{rayjob}"] = rayjob_state({"status": status})
            token = page["metadata"].get("continue")
            if not token:
                return states

    def _list_page(self, client: ApiClient, token: str, table: bool) -> dict:
        """One page of the console's RayJobs: a Table of KubeRay's columns, or objects."""
        query = [("labelSelector", MANAGED_BY_SELECTOR), ("limit", LIST_PAGE)]
        if token:
            query.append(("continue", token))
        if table:
            query.append(("includeObject", "None"))
        return client.call_api(
            f"/apis/{RAY_GROUP}/{RAY_VERSION}/namespaces/{self.namespace}/{RAYJOB_PLURAL}",
            "GET",
            query_params=query,
            header_params={"Accept": TABLE if table else "application/json"},
            response_types_map={200: "object"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _request_timeout=self.timeout,
        )

    def cancel(self, job_id: str) -> None:
        """Delete the RayJob (KubeRay stops its cluster with it); one already gone is done,
        and so is one being deleted (its finalizer still held by KubeRay)."""
        namespace, name = _rayjob_id(job_id)
        with self._client() as client:
            try:
                CustomObjectsApi(client).delete_namespaced_custom_object(
                    RAY_GROUP,
                    RAY_VERSION,
                    namespace,
                    RAYJOB_PLURAL,
                    name,
                    _request_timeout=self.timeout,
                )
            except ApiException as error:
                if error.status != 404:
                    raise

    @contextmanager
    def _client(self):
        """A client for one call; the client's errors come out as BackendError."""
        client = self._new_client()
        host = client.configuration.host
        try:
            yield client
        except ApiException as error:
            if error.status in LATER:
                raise OutcomeUnknown(self._refusal(host, error)) from error
            raise BackendError(self._refusal(host, error)) from error
        except urllib3.exceptions.HTTPError as error:
            reason = getattr(error, "reason", None) or error
            message = f"Kubernetes API at {host} did not answer: {reason}"
            never_sent = urllib3.exceptions.ConnectTimeoutError  # NewConnectionError is one
            if isinstance(error, never_sent) or isinstance(reason, never_sent):
                raise BackendError(message) from error
            raise OutcomeUnknown(message) from error
        finally:
            # ApiClient.close() only stops its thread pool; this closes the sockets.
            client.rest_client.pool_manager.clear()

    def _new_client(self) -> ApiClient:
        configuration = Configuration()  # a fresh one: the process-wide default stays untouched
        configuration.retries = 0  # urllib3 would retry 3 times; the next refresh is the retry
        if self.context:
            return self._client_from_kubeconfig(configuration)
        configuration.host = self.api_url
        token = self._token()
        if token:
            configuration.api_key = {"BearerToken": token}
            configuration.api_key_prefix = {"BearerToken": "Bearer"}
        return ApiClient(configuration)

    def _client_from_kubeconfig(self, configuration: Configuration) -> ApiClient:
        try:
            # KUBECONFIG is read here because the client reads it once, at import.
            # persist_config=False: refreshing a token must not rewrite the operator's file.
            return new_client_from_config(
                config_file=os.environ.get("KUBECONFIG"),
                context=self.context,
                persist_config=False,
                client_configuration=configuration,
            )
        except ConfigException as error:
            raise BackendError(
                f"kubeconfig context {self.context!r} cannot be used: {error}"
            ) from error

    def _token(self) -> str:
        """The bearer token, read now so a rotated token is used at the next call."""
        return read_token(
            env_key="kube_token_env",
            env_name=self.token_env,
            file_key="kube_token_file",
            file_path=self.token_file,
        )

    def _refusal(self, host: str, error: ApiException) -> str:
        if not error.status:  # the client's own failure before any answer, e.g. TLS
            return f"Kubernetes API at {host} did not answer: {error.reason}"
        said = f"Kubernetes API at {host} answered {error.status} {error.reason}"
        if error.status == 401:
            check = (
                f"the credentials of kubeconfig context {self.context!r}"
                if self.context
                else "config.kube_token_env or config.kube_token_file"
            )
            return f"{said}: authentication failed; check {check}"
        return f"{said}: {api_message(error)}"


def _rayjob_id(job_id: str) -> tuple[str, str]:
    namespace, _, name = job_id.partition("/")
    if not namespace or not name:
        raise BackendError(f"{job_id!r} is not a RayJob id of the form <namespace>/<name>")
    return namespace, name


def rayjob_state(rayjob: dict) -> str:
    """A RayJob's state in KubeRay's words (see ``KubernetesBackend.job_state``)."""
    status = rayjob.get("status") or {}
    job, deployment = status.get("jobStatus"), status.get("jobDeploymentStatus")
    if deployment in DEPLOYMENT_FAILED and not job_state_is_final(job or ""):
        return "FAILED"
    return job or deployment or "PENDING"


def rayjob_read(rayjob: dict) -> JobRead:
    """A RayJob's state with KubeRay's reason and message (Ray's job message, which names a
    node that died or a pod evicted under the job: H8)."""
    status = rayjob.get("status") or {}
    return JobRead(
        state=rayjob_state(rayjob),
        reason=str(status.get("reason") or ""),
        message=str(status.get("message") or "")[:2000],
    )


def _status(error: ApiException) -> dict:
    """The Status object the API server sends with an error (empty when it sent none)."""
    try:
        body = json.loads(error.body)
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _reason(error: ApiException) -> str:
    return _status(error).get("reason") or ""


def object_not_found(error: ApiException, name: str) -> bool:
    """A 404 for the object ``name`` itself, whose Status names it. A 404 without that
    (the server does not serve RayJobs: KubeRay's CRD missing, or an API server just
    restarted that has not yet read its CRDs) says nothing of the object, and is an error."""
    details = _status(error).get("details") or {}
    return error.status == 404 and details.get("name") == name


def api_message(error: ApiException) -> str:
    """The API server's own words: the ``message`` of the Status it sends with an error
    (for a manifest it refuses, the fields it refuses, by path)."""
    return _status(error).get("message") or error.reason or ""


def machine_from_node(node) -> Machine:
    """One node as a Machine: its GPUs, and whether it is Ready and schedulable."""
    capacity = _gpu_count(node.status.capacity)
    allocatable = _gpu_count(node.status.allocatable)
    count = capacity if allocatable is None else allocatable
    name = (node.metadata.labels or {}).get(GPU_PRODUCT_LABEL, GPU_RESOURCE)
    cards = [{"name": name, "count": count}] if count else []
    state, reason = _scheduling(node)
    conditions = node_problems(node)
    if conditions and state == SchedulingState.SCHEDULABLE:
        # H8: health as Kubernetes says it, shown; what keeps pods away is its own (taints).
        reason = "Kubernetes: " + "; ".join(
            f"{c['type']}"
            + (f" ({c['message'] or c['reason']})" if c["message"] or c["reason"] else "")
            for c in conditions
        )
    return Machine(
        name=node.metadata.name,
        cards=cards,
        state=state,
        reason=reason[:500],
        detail={
            "gpu_capacity": capacity or 0,
            "gpu_allocatable": allocatable or 0,
            **({"conditions": conditions} if conditions else {}),
        },
    )


def node_problems(node) -> list[dict]:
    """H8: a node's conditions that say something is wrong, as Kubernetes (and a node problem
    detector's own condition types, a GPU's among them) says it: any but Ready that is True
    (MemoryPressure, DiskPressure, PIDPressure, NetworkUnavailable, KernelDeadlock, …).
    Read and shown only: the console never cordons or uncordons a cluster's node."""
    return [
        {
            "type": c.type,
            "status": c.status,
            "reason": c.reason or "",
            "message": (c.message or "")[:200],
        }
        for c in node.status.conditions or []
        if c.type != "Ready" and c.status == "True"
    ]


def _gpu_count(resources: dict | None) -> int | None:
    quantity = (resources or {}).get(GPU_RESOURCE)
    return None if quantity is None else int(quantity)


def _scheduling(node) -> tuple[str, str]:
    ready = next((c for c in node.status.conditions or [] if c.type == "Ready"), None)
    if ready is None:
        return SchedulingState.GONE, "Kubernetes reports no Ready condition"
    if ready.status != "True":
        return SchedulingState.GONE, ready.message or ready.reason or f"Ready is {ready.status}"
    if node.spec and node.spec.unschedulable:
        return SchedulingState.CORDONED, CORDON_REASON
    return SchedulingState.SCHEDULABLE, ""


def rayjob_name_prefix(job_name: str) -> str:
    """A generateName KubeRay accepts: a DNS-1035 label (starts with a letter), short enough."""
    slug = re.sub(r"[^a-z0-9]+", "-", job_name.lower()).strip("-")
    if not slug[:1].isalpha():
        slug = f"job-{slug}"
    return slug[: RAYJOB_PREFIX_MAX - 1].rstrip("-") + "-"


def rayjob_naming(job: JobSpec) -> dict:
    """A keyed job's RayJob has a name of its own, the same at every attempt; without a key,
    the API server picks one (generateName)."""
    if not job.key:
        return {"generateName": rayjob_name_prefix(job.name), "labels": dict(MANAGED_BY)}
    key = re.sub(r"[^a-z0-9-]+", "-", job.key.lower()).strip("-")
    prefix = rayjob_name_prefix(job.name)[: RAYJOB_NAME_MAX - len(key) - 1].rstrip("-")
    return {"name": f"{prefix}-{key}", "labels": {**MANAGED_BY, KEY_LABEL: job.key}}


def rayjob_manifest(job: JobSpec) -> dict:
    """A RayJob whose cluster has one worker per node, each with the job's cards."""
    worker_pod = {
        "containers": [
            {
                "name": "ray-worker",
                "image": f"rayproject/ray:{RAY_IMAGE_TAG}-gpu",
                "resources": {"limits": {GPU_RESOURCE: job.cards}},
            }
        ]
    }
    if job.series:
        worker_pod["nodeSelector"] = {GPU_PRODUCT_LABEL: job.series}
    return {
        "apiVersion": f"{RAY_GROUP}/{RAY_VERSION}",
        "kind": "RayJob",
        "metadata": rayjob_naming(job),
        "spec": {
            "entrypoint": job.script,
            "shutdownAfterJobFinishes": True,  # the cluster's GPUs go back when the job ends
            "rayClusterSpec": {
                "rayVersion": RAY_IMAGE_TAG,
                "headGroupSpec": {
                    "rayStartParams": {},  # required by KubeRay before 1.1
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "ray-head", "image": f"rayproject/ray:{RAY_IMAGE_TAG}"}
                            ]
                        }
                    },
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": job.nodes,
                        "minReplicas": job.nodes,
                        "maxReplicas": job.nodes,
                        "rayStartParams": {},
                        "template": {"spec": worker_pod},
                    }
                ],
            },
        },
    }
