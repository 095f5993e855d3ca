"""A `slurm` Fleet against a real Slurm 24.11 cluster, in each API version it serves
(DESIGN.md §6; J4, D1, P6, P7): tests/slurm24_cluster.py's trixie chroot, one node, four fake
H100s, slurmrestd on loopback serving v0.0.40, v0.0.41 and v0.0.42.
"""

import time

import pytest
from django.test import TestCase

from audit.models import AuditEvent
from audit.services import Actor
from nodes.backends import backend_for
from nodes.backends.slurm import _negotiated
from nodes.models import CardAlias, HardwareSeries
from nodes.services.clusters import cluster_refresh
from nodes.services.hardware import card_alias_map
from placement.admission import Need, admit_automatically
from placement.handover import _spec, cluster_job_handover, cluster_jobs_track
from placement.services.submission import training_job_submit
from tests.audit.scenarios import tasks_run_at_once
from tests.slurm24_cluster import API_VERSIONS
from tuneplane.errors import PlacementRefused

pytestmark = [pytest.mark.slurm]

TOKEN_ENV = "TUNEPLANE_TOKEN_TEST_SLURM24_JWT"


@pytest.fixture
def fleet_on(slurm24_cluster, make_fleet, monkeypatch, admin_user):
    """A function making the slurm Fleet ``hpc`` on the cluster's debug partition, speaking
    ``version`` ("" for none named), its card type mapped as an admin would (J4)."""
    monkeypatch.setenv(TOKEN_ENV, slurm24_cluster.token)
    card_alias_map(
        actor=Actor.of_user(admin_user),
        alias=CardAlias.objects.get(name="h100"),
        series=HardwareSeries.objects.get(slug="h100"),
    )

    def make(version: str):
        config = {
            "slurm_rest_url": slurm24_cluster.url,
            "slurm_partition": slurm24_cluster.partition,
            "slurm_user": "root",
            "slurm_token_env": TOKEN_ENV,
            "slurm_workdir": slurm24_cluster.job_dir,
        }
        if version:
            config["slurm_api_version"] = version
        return make_fleet("hpc", kind="slurm", capabilities=["train"], config=config)

    return make


@pytest.fixture(params=API_VERSIONS)
def hpc(request, fleet_on):
    """The Fleet in each version the cluster serves, read once."""
    fleet = fleet_on(request.param)
    cluster_refresh(fleet)
    return fleet


def submit(member, name: str, script: str, cards: int = 1):
    job = training_job_submit(
        actor=Actor.of_user(member),
        project="ml",
        name=name,
        series="h100",
        cards=cards,
        script=script,
    )
    assert job.fleet_id == "hpc", job.admission
    return job


def tracked_until(job, states: set[str], within: float = 60.0):
    """The job, read back by the refresh pass until Slurm says one of ``states``."""
    deadline = time.monotonic() + within
    while job.backend_state not in states and time.monotonic() < deadline:
        cluster_jobs_track()
        job.refresh_from_db()
        time.sleep(0.3)
    return job


def settled(fleet, within=30.0) -> dict:
    """The machine once Slurm calls it schedulable again, or as it is after ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        [machine] = cluster_refresh(fleet).machines
        if machine["state"] == "schedulable" or time.monotonic() > deadline:
            return machine
        time.sleep(0.3)


def test_unset_the_version_spoken_is_the_newest_the_cluster_offers_v0_0_42(fleet_on):
    [machine] = cluster_refresh(fleet_on("")).machines
    assert machine["detail"]["slurm_api_version"] == "v0.0.42"
    assert machine["cards"] == [{"name": "h100", "count": 4}]


def test_a_named_version_the_cluster_does_not_serve_is_an_error_naming_it(fleet_on):
    snapshot = cluster_refresh(fleet_on("v0.0.38"))
    assert "does not serve API v0.0.38" in snapshot.error


def test_its_machine_is_what_slurm_says_four_h100_none_used(hpc, slurm24_cluster):
    [machine] = cluster_refresh(hpc).machines
    assert machine["name"] == slurm24_cluster.node_name
    assert machine["cards"] == [{"name": "h100", "count": 4}] and machine["cards_used"] == 0
    assert machine["state"] == "schedulable"
    assert machine["detail"]["slurm_api_version"] == hpc.config["slurm_api_version"]
    assert machine["detail"]["gres"] == "gpu:h100:4"
    assert machine["detail"]["partitions"] == [slurm24_cluster.partition]


def test_D1_a_node_drained_in_slurm_is_a_cordon_with_slurms_own_reason(
    hpc, project, slurm24_cluster
):
    node = slurm24_cluster.node_name
    reason = f"fan-{hpc.config['slurm_api_version']}"
    slurm24_cluster.scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")
    try:
        [machine] = cluster_refresh(hpc).machines
        assert (machine["state"], machine["reason"]) == ("cordoned", f"Slurm drain: {reason}")
        assert machine["detail"]["state_flags"] == ["DRAIN"]
        with pytest.raises(PlacementRefused) as refusal:
            admit_automatically(project, Need("train", "h100", 1))
        assert refusal.value.reason == "inventory_fit"
    finally:
        slurm24_cluster.scontrol("update", f"NodeName={node}", "State=UNDRAIN")
    # Undrained, Slurm pings slurmd first (NOT_RESPONDING meanwhile: gone, to the console).
    assert (settled(hpc)["state"], settled(hpc)["reason"]) == ("schedulable", "")


def test_P7_a_job_is_handed_over_holds_its_cards_and_is_read_back_completed(hpc, member):
    job = submit(member, "finetune", "#!/bin/sh\nsleep 2\n", cards=2)

    job = cluster_job_handover(job.pk)

    assert job.backend_job_id.isdigit(), job.backend_error
    job = tracked_until(job, {"RUNNING", "COMPLETED"})
    if job.backend_state == "RUNNING":
        assert cluster_refresh(hpc).machines[0]["cards_used"] == 2  # gres_used, as Slurm holds
    job = tracked_until(job, {"COMPLETED"})
    assert (job.backend_state, job.state) == ("COMPLETED", "succeeded")
    states = list(
        AuditEvent.objects.filter(action="trainingjob.backend_state", target_id=str(job.pk))
        .order_by("pk")
        .values_list("after__backend_state", flat=True)
    )
    assert states[-1] == "COMPLETED" and len(states) == len(set(states))


def test_P7_a_handover_resumed_finds_the_job_slurm_took_by_its_key(hpc, member):
    job = cluster_job_handover(submit(member, "resumed", "#!/bin/sh\nsleep 1\n").pk)

    assert backend_for(hpc).resume(_spec(job)) == job.backend_job_id  # not a second job


def test_R10_a_running_job_cancelled_through_the_api_is_cancelled_in_slurm_and_read_back(
    hpc, member, member_api
):
    job = cluster_job_handover(submit(member, "cancel-me", "#!/bin/sh\nsleep 300\n").pk)
    assert tracked_until(job, {"RUNNING"}).backend_state == "RUNNING"

    with tasks_run_at_once(), TestCase.captureOnCommitCallbacks(execute=True):
        assert member_api.post(f"/api/training-jobs/{job.pk}/cancel").status_code == 200

    job.refresh_from_db()
    assert job.backend_cancel_sent_at is not None  # slurmrestd's job delete taken
    job = tracked_until(job, {"CANCELLED"}, within=30)
    assert (job.backend_state, job.state, job.reason) == ("CANCELLED", "cancelled", "cancelled")
    backend_for(hpc).cancel(job.backend_job_id)  # finished: nothing left to cancel, no error


def test_a_bad_token_is_a_refusal_that_names_no_token(hpc, monkeypatch, slurm24_cluster):
    monkeypatch.setenv(TOKEN_ENV, "not-a-jwt")
    snapshot = cluster_refresh(hpc)
    assert "refused the credentials (511" in snapshot.error, snapshot.error
    assert "not-a-jwt" not in snapshot.error and slurm24_cluster.token not in snapshot.error


def test_a_bad_token_while_the_version_is_found_is_a_refusal_not_a_missing_version(
    fleet_on, monkeypatch
):
    monkeypatch.setenv(TOKEN_ENV, "not-a-jwt")
    fleet = fleet_on("")
    _negotiated.clear()  # what an earlier test found with a good token: asked again
    snapshot = cluster_refresh(fleet)
    assert "refused the credentials (511" in snapshot.error, snapshot.error
    assert "not-a-jwt" not in snapshot.error
