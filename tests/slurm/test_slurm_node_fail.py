"""H8 (issue 48) against a real Slurm 22.05 cluster (tests/slurm_cluster.py): a node set down
under a running job, as an operator or slurmctld's own health does, and what the console
reads of it — Slurm's own requeue (the same attempt, nothing spent), or a NODE_FAIL for a job
that may not be requeued (infrastructure: handed to Slurm again on the job's infra budget);
and the node's DOWN reason shown as Slurm gives it, left to Slurm."""

import time
from datetime import timedelta

import pytest

from audit.services import Actor
from nodes.backends import backend_for
from nodes.services.clusters import cluster_refresh
from placement.handover import cluster_job_handover, cluster_jobs_track
from placement.models import Attempt, TrainingJob
from placement.services.submission import training_job_submit
from tests.slurm.test_slurm_fleet import hpc, settled  # noqa: F401  (the Fleet fixture)

pytestmark = [pytest.mark.slurm]


def _until(job, done, within=60.0) -> TrainingJob:
    deadline = time.monotonic() + within
    while True:
        cluster_jobs_track()
        job.refresh_from_db()
        if done(job) or time.monotonic() > deadline:
            return job
        time.sleep(0.3)


@pytest.fixture
def running(hpc, member):  # noqa: F811
    """A job running in Slurm, whose user gave it one attempt; cancelled in Slurm at the end."""
    job = training_job_submit(
        actor=Actor.of_user(member),
        project="ml",
        name="long",
        series="h100",
        cards=1,
        script="#!/bin/sh\nsleep 300\n",
    )
    TrainingJob.objects.filter(pk=job.pk).update(max_attempts=1)
    job = _until(cluster_job_handover(job.pk), lambda j: j.backend_state == "RUNNING")
    assert job.backend_state == "RUNNING", job.backend_error
    handed = [job.backend_job_id]
    yield job, handed
    backend = backend_for(hpc)
    for slurm_job in {*handed, TrainingJob.objects.get(pk=job.pk).backend_job_id} - {""}:
        backend.cancel(slurm_job)


def _down(slurm_cluster, reason: str) -> None:
    slurm_cluster.scontrol(
        "update", f"NodeName={slurm_cluster.node_name}", "State=DOWN", f"Reason={reason}"
    )


def _resume(slurm_cluster) -> None:
    """Back, if ReturnToService=2 has not brought it back already (slurmd re-registered)."""
    try:
        slurm_cluster.scontrol("update", f"NodeName={slurm_cluster.node_name}", "State=RESUME")
    except RuntimeError as error:
        assert "Invalid node state" in str(error)


def test_H8_a_job_slurm_requeues_after_its_node_failed_is_the_same_attempt_spending_nothing(
    running,
    hpc,  # noqa: F811
    slurm_cluster,
):
    job, _ = running
    _down(slurm_cluster, "h8-node-down")
    try:
        job = _until(job, lambda j: j.state == "queued", within=30)
    finally:
        _resume(slurm_cluster)
    read = backend_for(hpc).job_read(job.backend_job_id)
    assert read.restarts >= 1  # Slurm requeued it itself
    assert (job.state, job.backend_job_id) == ("queued", running[1][0])  # the same job
    assert not Attempt.objects.filter(training_job=job).exists()  # no attempt ended
    # The console left the node to Slurm: it is back by Slurm's own ReturnToService.
    assert settled(hpc)["state"] == "schedulable"
    # Slurm runs it again once its requeue delay is past (BeginTime): Slurm's, not ours.
    assert read.state == "PENDING"


def test_H8_a_node_fail_is_infrastructure_and_the_job_is_handed_to_slurm_again(
    running,
    hpc,  # noqa: F811
    slurm_cluster,
):
    job, handed = running
    slurm_cluster.scontrol("update", f"JobId={job.backend_job_id}", "Requeue=0")
    _down(slurm_cluster, "h8-node-fail")
    try:
        job = _until(job, lambda j: j.backend_job_id == "", within=30)
    finally:
        _resume(slurm_cluster)
    assert (job.state, job.backend_state) == ("queued", "NODE_FAIL")
    attempt = Attempt.objects.get(training_job=job)
    assert (attempt.end_class, attempt.reason) == ("infrastructure", "node_fail")
    assert job.reason == "retrying after node_fail" and job.not_before
    settled(hpc)
    TrainingJob.objects.filter(pk=job.pk).update(not_before=job.not_before - timedelta(hours=1))
    job = _until(job, lambda j: j.state == "running")
    handed.append(job.backend_job_id)
    assert job.backend_job_id not in ("", handed[0])  # a new submission to Slurm
    assert job.state == "running"  # max_attempts: 1 not spent


def test_H8_a_nodes_drain_reason_is_shown_as_slurm_gives_it_and_never_fought(
    running,
    hpc,  # noqa: F811
    slurm_cluster,
):
    """Drained under a running job (slurmctld's HealthCheckProgram, or an operator): the
    machine shows Slurm's reason; the job runs on; the console's passes leave the drain be."""
    job, _ = running
    node = slurm_cluster.node_name
    slurm_cluster.scontrol("update", f"NodeName={node}", "State=DRAIN", "Reason=h8-xid-79")
    try:
        for _ in range(3):
            [machine] = cluster_refresh(hpc).machines
            job = _until(job, lambda j: True)
        assert (machine["state"], machine["reason"]) == ("cordoned", "Slurm drain: h8-xid-79")
        assert job.state == "running"
        shown = slurm_cluster.scontrol("show", "node", node)
        assert "DRAIN" in shown and "h8-xid-79" in shown  # still Slurm's, untouched
    finally:
        slurm_cluster.scontrol("update", f"NodeName={node}", "State=RESUME")
    assert settled(hpc)["state"] == "schedulable"
