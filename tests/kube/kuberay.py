"""A stand-in for the KubeRay operator (1.3): it moves a RayJob's status as KubeRay's RayJob
controller does, through the status subresource, and holds and lets go of its finalizer.

Only what the console reads is moved: ``jobDeploymentStatus`` (New → Initializing → Running
→ Complete | Failed | ValidationFailed) and ``jobStatus`` (PENDING → RUNNING → SUCCEEDED |
FAILED | STOPPED), with ``rayClusterName``, ``reason`` and the times. No Ray cluster exists:
what is proven against the real API server is the objects' life, not Ray's.

As a controller, every write names the resourceVersion it read: one the API server has moved
past answers 409 Conflict, and the stand-in reads again and retries, as controller-runtime's
``Status().Update`` callers do.
"""

import datetime

from kubernetes.client import CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from nodes.backends.kubernetes import RAY_GROUP, RAY_VERSION, RAYJOB_PLURAL

FINALIZER = "ray.io/rayjob-finalizer"
NAME_MAX = 47  # KubeRay 1.3's ValidateRayJobMetadata


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeRayStandIn:
    def __init__(self, api: CustomObjectsApi, namespace: str):
        self.api, self.namespace = api, namespace
        self.conflicts = 0  # 409s met and retried

    def get(self, name: str) -> dict:
        return self.api.get_namespaced_custom_object(
            RAY_GROUP, RAY_VERSION, self.namespace, RAYJOB_PLURAL, name
        )

    def admit(self, name: str) -> dict:
        """The first reconcile: KubeRay's finalizer on the object, then Initializing (or
        ValidationFailed, for a name KubeRay refuses)."""
        self._update(name, lambda job: job["metadata"].setdefault("finalizers", [FINALIZER]))
        if len(name) > NAME_MAX:
            return self.move(
                name,
                jobDeploymentStatus="ValidationFailed",
                reason="ValidationFailed",
                message=f"The RayJob metadata is invalid: RayJob name should be no more than "
                f"{NAME_MAX} characters",
            )
        return self.move(
            name,
            jobDeploymentStatus="Initializing",
            jobStatus="PENDING",
            startTime=_now(),
            rayClusterName=f"{name}-raycluster",
        )

    def run(self, name: str) -> dict:
        return self.move(name, jobDeploymentStatus="Running", jobStatus="RUNNING")

    def finish(self, name: str, job_status: str) -> dict:
        """The Ray job ended SUCCEEDED, FAILED or STOPPED: Complete, or Failed for a failed
        job (KubeRay 1.2+, reason AppFailed)."""
        deployment = "Failed" if job_status == "FAILED" else "Complete"
        extra = {"reason": "AppFailed"} if job_status == "FAILED" else {}
        return self.move(
            name, jobDeploymentStatus=deployment, jobStatus=job_status, endTime=_now(), **extra
        )

    def lose_node(self, name: str, *, head: bool = False) -> dict:
        """A node lost under the running job — its pod evicted for it, or the node gone: Ray's
        job FAILED, with Ray's words for it, which KubeRay copies into status.message; the
        RayJob Failed, reason AppFailed (what the console reads to call it infrastructure,
        H8). The head's node lost takes the job's supervisor actor with it; a worker's, the
        driver's actor on it."""
        died = "The actor died because its node has died. Node Id: 3f9c0d1e"
        message = (
            f"Job supervisor actor died: {died}"
            if head
            else "Job entrypoint command failed with exit code 1, last available logs "
            f"(truncated to 20,000 chars):\nray.exceptions.ActorDiedError: {died}\n"
            "\tthe actor's node was terminated unexpectedly: its pod was evicted"
        )
        return self.move(
            name,
            jobDeploymentStatus="Failed",
            jobStatus="FAILED",
            reason="AppFailed",
            message=message,
            endTime=_now(),
        )

    def give_up(self, name: str, reason: str = "DeadlineExceeded") -> dict:
        """Past activeDeadlineSeconds or backoffLimit: Failed, the jobStatus left as it was."""
        return self.move(name, jobDeploymentStatus="Failed", reason=reason, endTime=_now())

    def reap(self, name: str) -> None:
        """A RayJob being deleted: its Ray job stopped and cluster gone, the finalizer is let
        go and the API server removes the object."""

        def drop(job):
            job["metadata"]["finalizers"] = [
                f for f in job["metadata"].get("finalizers", []) if f != FINALIZER
            ]

        self._update(name, drop)

    def move(self, name: str, **status) -> dict:
        def change(job):
            job["status"] = {**(job.get("status") or {}), **status}

        return self._update(name, change, subresource="status")

    def _update(self, name: str, change, subresource: str = "") -> dict:
        """Read, change, write with the resourceVersion read; on 409 read again."""
        replace = (
            self.api.replace_namespaced_custom_object_status
            if subresource
            else self.api.replace_namespaced_custom_object
        )
        for _ in range(10):
            job = self.get(name)
            change(job)
            try:
                return replace(RAY_GROUP, RAY_VERSION, self.namespace, RAYJOB_PLURAL, name, job)
            except ApiException as error:
                if error.status != 409:
                    raise
                self.conflicts += 1
        raise AssertionError(f"RayJob {name}: 10 conflicts in a row")
