"""H8 (issue 48): on a cluster Fleet a job's end is read from its manager's words and gets
H1's class — the manager's node failures are ``infrastructure``, the job's own failures
``user`` — over every Slurm state and KubeRay status the backends know (pure:
placement.faults.manager_end_class); the parsing of slurmrestd's and KubeRay's answers
(nodes.backends); and the tracking pass that records the attempt and hands an
infrastructure end to the manager again on the job's infra_retries, never spending
max_attempts (H2), against replayed Kubernetes API responses."""

from datetime import timedelta

import pytest

from audit.models import AuditEvent
from nodes.backends.base import FINAL_JOB_STATES, JobRead
from nodes.backends.kubernetes import rayjob_read
from nodes.backends.slurm import job_read_of
from nodes.backends.slurm_api import DIALECTS
from placement import faults
from placement.choices import EndClass, JobState
from placement.faults import manager_end_class
from placement.handover import MANAGER_STATES, cluster_job_handover, cluster_jobs_track
from placement.models import Attempt, TrainingJob
from tests.audit.scenarios import RAYJOB, RAYJOBS

INFRA, USER = EndClass.INFRASTRUCTURE, EndClass.USER

# Every Slurm job state (base states, and the flags v0.0.38 spells as the one word).
SLURM_ENDS = {
    "COMPLETED": USER,
    "CANCELLED": USER,
    "FAILED": USER,
    "OUT_OF_MEMORY": USER,
    "TIMEOUT": USER,
    "DEADLINE": USER,
    "NODE_FAIL": INFRA,
    "BOOT_FAIL": INFRA,
    "LAUNCH_FAILED": INFRA,
    "PREEMPTED": "",  # Q6: neither
    **dict.fromkeys(faults.SLURM_LIVE, ""),
    **dict.fromkeys(faults.SLURM_REQUEUED, ""),
}
# KubeRay's jobStatus words, and jobDeploymentStatus where jobStatus is not set.
KUBERAY_ENDS = {
    "SUCCEEDED": USER,
    "STOPPED": USER,
    "FAILED": USER,
    "PENDING": "",
    "RUNNING": "",
    **dict.fromkeys(
        ("New", "Initializing", "Running", "Suspending", "Suspended", "Retrying", "Waiting"), ""
    ),
}


@pytest.mark.parametrize("state,expected", sorted(SLURM_ENDS.items()))
def test_H8_every_slurm_state_has_its_class(state, expected):
    assert manager_end_class(state) == expected
    assert manager_end_class(state.lower()) == expected  # the manager's case is not ours


@pytest.mark.parametrize("state,expected", sorted(KUBERAY_ENDS.items()))
def test_H8_every_kuberay_status_has_its_class(state, expected):
    assert manager_end_class(state) == expected


def test_H8_every_final_word_a_backend_stops_reading_has_a_class_but_a_preemption():
    for state in FINAL_JOB_STATES - {"PREEMPTED"}:
        assert manager_end_class(state) in (INFRA, USER), state
    assert manager_end_class("PREEMPTED") == ""


@pytest.mark.parametrize(
    "reason,expected",
    [
        ("NonZeroExitCode", USER),
        ("RaisedSignal", USER),
        ("", USER),
        ("NodeDown", INFRA),
        ("JobLaunchFailure", INFRA),
        ("Prolog", INFRA),
    ],
)
def test_H8_a_slurm_job_failed_by_its_node_is_infrastructure_by_its_state_reason(reason, expected):
    assert manager_end_class("FAILED", reason=reason) == expected
    # A time limit or memory is the job's own, whatever else is said.
    assert manager_end_class("TIMEOUT", reason="TimeLimit") == USER
    assert manager_end_class("OUT_OF_MEMORY", reason="OutOfMemory") == USER


@pytest.mark.parametrize(
    "reason,message,expected",
    [
        ("AppFailed", "Job entrypoint command failed with exit code 1", USER),
        ("AppFailed", "Traceback ... ZeroDivisionError: division by zero", USER),
        ("DeadlineExceeded", "The RayJob has passed the activeDeadlineSeconds", USER),
        ("ValidationFailed", "RayJob name should be no more than 47 characters", USER),
        ("JobDeploymentStatusTransitionGracePeriodExceeded", "did not reach terminal", USER),
        ("SubmissionFailed", "Job submission has failed. Reason: BackoffLimitExceeded", INFRA),
        (
            "AppFailed",
            "Job supervisor actor died: The actor died because its node has died. Node Id: 5e1c…",
            INFRA,
        ),
        ("AppFailed", "ray.exceptions.NodeDiedError: the node was terminated", INFRA),
        (
            "AppFailed",
            "Pod raycluster-gpu-worker-x was Evicted: The node was low on resource",
            INFRA,
        ),
        ("AppFailed", "pod deleted: DisruptionTarget DeletionByTaintManager", INFRA),
    ],
)
def test_H8_a_rayjob_failed_for_its_node_or_an_evicted_pod_is_infrastructure(
    reason, message, expected
):
    assert manager_end_class("FAILED", reason=reason, message=message) == expected


def test_H8_a_requeued_slurm_job_is_read_as_requeued_in_every_dialect():
    old, new = DIALECTS["v0.0.38"], DIALECTS[next(v for v in DIALECTS if v != "v0.0.38")]
    assert job_read_of({"job_state": "REQUEUED", "restart_cnt": 1}, old) == JobRead(
        "REQUEUED", restarts=1
    )
    read = job_read_of(
        {"job_state": ["PENDING", "REQUEUED"], "restart_cnt": 2, "state_reason": "BeginTime"},
        new,
    )
    assert read == JobRead("REQUEUED", reason="BeginTime", restarts=2)
    assert job_read_of({"job_state": ["PENDING"], "restart_cnt": 0}, new).state == "PENDING"
    read = job_read_of({"job_state": ["NODE_FAIL"], "state_reason": "NodeDown"}, new)
    assert (read.state, manager_end_class(read.state, reason=read.reason)) == ("NODE_FAIL", INFRA)
    # The manager's own requeue is the same attempt: queued again, no class.
    assert MANAGER_STATES["REQUEUED"] == JobState.QUEUED and manager_end_class("REQUEUED") == ""


def test_H8_a_rayjobs_reason_and_message_are_read():
    read = rayjob_read(
        {
            "status": {
                "jobStatus": "FAILED",
                "jobDeploymentStatus": "Failed",
                "reason": "AppFailed",
                "message": "Job supervisor actor died: its node has died",
            }
        }
    )
    assert read == JobRead("FAILED", "AppFailed", "Job supervisor actor died: its node has died")


# -- the tracking pass ---------------------------------------------------------------------

NODE_LOST = {
    "kind": "RayJob",
    "status": {
        "jobStatus": "FAILED",
        "jobDeploymentStatus": "Failed",
        "reason": "AppFailed",
        "message": "Job supervisor actor died: The actor died because its node has died.",
    },
}
OWN_FAILURE = {
    "kind": "RayJob",
    "status": {"jobStatus": "FAILED", "jobDeploymentStatus": "Failed", "reason": "AppFailed"},
}


@pytest.fixture
def running(world):
    job, replay = world.cluster_job()
    TrainingJob.objects.filter(pk=job.pk).update(max_attempts=1)
    cluster_job_handover(job.pk)
    replay.serve("GET", RAYJOB, "rayjob-running.json")
    cluster_jobs_track()
    return TrainingJob.objects.get(pk=job.pk), replay


def _posts(replay):
    return [r for r in replay.requests if r.method == "POST" and r.path == RAYJOBS]


def test_H8_a_node_lost_under_a_rayjob_is_handed_to_the_manager_again_unspent(
    running, member_api, admin_client
):
    job, replay = running
    key = job.handover_key
    replay.serve("GET", RAYJOB, NODE_LOST)
    cluster_jobs_track()
    job = TrainingJob.objects.get(pk=job.pk)
    assert job.state == "queued" and job.reason == "retrying after failed"
    assert job.backend_job_id == "" and job.not_before is not None
    attempt = Attempt.objects.get(training_job=job)
    assert (attempt.end_class, attempt.reason, attempt.number) == (INFRA, "failed", 1)
    event = AuditEvent.objects.filter(action="trainingjob.backend_state").latest("id")
    assert event.after["end_class"] == INFRA and event.after["infra_retries"]["used"] == 1
    assert event.before["backend_job_id"] == "ml-jobs/llama-sft-7b-x9k2p"
    shown = member_api.get(f"/api/training-jobs/{job.pk}").json()
    assert [a["end_class"] for a in shown["attempts"]] == [INFRA]
    assert shown["infra_retries"]["used"] == 1 and shown["state"] == "queued"
    page = admin_client.get(f"/admin/placement/trainingjob/{job.pk}/change/")
    assert page.status_code == 200 and INFRA in page.content.decode()
    cluster_jobs_track()
    assert len(_posts(replay)) == 1  # its backoff (H2) still runs: not handed over yet
    TrainingJob.objects.filter(pk=job.pk).update(not_before=job.not_before - timedelta(hours=1))
    replay.serve("GET", RAYJOB, "rayjob-running.json")
    cluster_jobs_track()
    posts = _posts(replay)
    assert len(posts) == 2  # a new submission through the backend's submit path
    job = TrainingJob.objects.get(pk=job.pk)
    assert job.handover_key and job.handover_key != key  # a new RayJob, not the failed one
    assert posts[1].body["metadata"]["labels"]["tuneplane.io/handover-key"] == job.handover_key
    assert (job.state, job.backend_state) == ("running", "RUNNING")
    # max_attempts: 1 is not spent: its own failure now still fails it once, at once.
    replay.serve("GET", RAYJOB, OWN_FAILURE)
    cluster_jobs_track()
    job = TrainingJob.objects.get(pk=job.pk)
    assert (job.state, job.reason) == ("failed", "failed")
    assert list(Attempt.objects.filter(training_job=job).values_list("number", "end_class")) == [
        (1, INFRA),
        (2, USER),
    ]


def test_H8_the_jobs_own_failure_fails_it_as_before(running):
    job, replay = running
    replay.serve("GET", RAYJOB, OWN_FAILURE)
    cluster_jobs_track()
    job = TrainingJob.objects.get(pk=job.pk)
    assert (job.state, job.reason, job.backend_job_id) == (
        "failed",
        "failed",
        "ml-jobs/llama-sft-7b-x9k2p",
    )
    assert Attempt.objects.get(training_job=job).end_class == USER
    assert len(_posts(replay)) == 1


def test_H8_past_infra_retries_a_node_loss_fails_the_job(running, settings):
    job, replay = running
    job.fleet.config = {**job.fleet.config, "infra_retries": 0}
    job.fleet.save(update_fields=["config"])
    replay.serve("GET", RAYJOB, NODE_LOST)
    cluster_jobs_track()
    job = TrainingJob.objects.get(pk=job.pk)
    assert (job.state, job.reason) == ("failed", "failed; infra_retries spent")
    assert Attempt.objects.get(training_job=job).end_class == INFRA


# -- health as the manager says it, shown and never fought ---------------------------------


def test_H8_a_slurm_nodes_drain_and_down_reasons_are_shown_as_slurm_gives_them():
    from nodes.backends.slurm import scheduling_state_of

    drained = {"state": "idle", "state_flags": ["DRAIN"], "reason": "xid 79 on gpu2"}
    assert scheduling_state_of(drained) == ("cordoned", "Slurm drain: xid 79 on gpu2")
    down = {"state": "down", "state_flags": [], "reason": "Not responding"}
    assert scheduling_state_of(down) == ("gone", "Slurm: down Not responding")


def test_H8_a_kubernetes_nodes_conditions_are_shown_and_it_stays_kubernetes_to_keep_pods_off():
    from kubernetes.client import V1Node, V1NodeCondition, V1NodeStatus, V1ObjectMeta

    from nodes.backends.kubernetes import machine_from_node

    def node(*conditions):
        return V1Node(
            metadata=V1ObjectMeta(name="gpu-1"),
            status=V1NodeStatus(
                capacity={"nvidia.com/gpu": "8"},
                allocatable={"nvidia.com/gpu": "8"},
                conditions=[V1NodeCondition(type="Ready", status="True"), *conditions],
            ),
        )

    healthy = machine_from_node(
        node(V1NodeCondition(type="MemoryPressure", status="False", reason="KubeletHasSufficient"))
    )
    assert (healthy.state, healthy.reason, "conditions" in healthy.detail) == (
        "schedulable",
        "",
        False,
    )
    sick = machine_from_node(
        node(
            V1NodeCondition(type="GpuProblem", status="True", reason="XID79", message="fell off"),
            V1NodeCondition(type="DiskPressure", status="True", reason="KubeletHasDiskPressure"),
        )
    )
    assert sick.state == "schedulable"  # Kubernetes' taints keep pods off, not the console
    assert sick.reason == "Kubernetes: GpuProblem (fell off); DiskPressure (KubeletHasDiskPressure)"
    assert [c["type"] for c in sick.detail["conditions"]] == ["GpuProblem", "DiskPressure"]


def test_H8_the_console_never_fights_a_managers_health_no_backend_cordons_or_drains():
    from nodes.backends.kubernetes import KubernetesBackend
    from nodes.backends.slurm import SlurmBackend

    for backend in (SlurmBackend, KubernetesBackend):
        verbs = [n for n in dir(backend) if any(w in n for w in ("cordon", "drain", "taint"))]
        assert verbs == [], backend


def test_H8_R10_a_node_lost_under_a_job_asked_to_stop_ends_it_cancelled_never_handed_over(
    running,
):
    job, replay = running
    TrainingJob.objects.filter(pk=job.pk).update(
        cancel_requested_at=job.created_at, backend_cancel_sent_at=job.created_at
    )
    replay.serve("GET", RAYJOB, NODE_LOST)
    cluster_jobs_track()
    job = TrainingJob.objects.get(pk=job.pk)
    assert (job.state, job.reason) == ("cancelled", "cancelled") and job.ended_at
    assert Attempt.objects.get(training_job=job).end_class == INFRA
    cluster_jobs_track()
    assert len(_posts(replay)) == 1
