"""A `slurm` Fleet against a real Slurm 22.05 cluster (DESIGN.md §6; L1, D1, J4, P6, P7).

The cluster is tests/slurm_cluster.py's: one node, four fake H100s, slurmrestd on loopback.
"""

import socket
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from django.test import TestCase
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import Actor
from fleets.models import Fleet
from nodes.backends import backend_for
from nodes.models import CardAlias, HardwareSeries
from nodes.services.clusters import cluster_refresh
from nodes.services.hardware import card_alias_map
from placement.admission import Need, admit_automatically
from placement.handover import _spec, cluster_job_handover, cluster_jobs_track
from placement.models import TrainingJob
from placement.services.submission import training_job_submit
from tests.audit.scenarios import tasks_run_at_once
from tuneplane.errors import PlacementRefused

pytestmark = [pytest.mark.slurm]

TOKEN_ENV = "TUNEPLANE_TOKEN_TEST_SLURM_JWT"


@pytest.fixture
def hpc(slurm_cluster, make_fleet, monkeypatch, tmp_path, admin_user):
    """A slurm Fleet on the cluster's debug partition, its card type mapped as an admin
    would map it (J4), and read once."""
    monkeypatch.setenv(TOKEN_ENV, slurm_cluster.token)
    fleet = make_fleet(
        "hpc",
        kind="slurm",
        capabilities=["train"],
        config={
            "slurm_rest_url": slurm_cluster.url,
            "slurm_api_version": "v0.0.38",
            "slurm_partition": slurm_cluster.partition,
            "slurm_user": "root",
            "slurm_token_env": TOKEN_ENV,
            "slurm_workdir": str(tmp_path),
        },
    )
    cluster_refresh(fleet)
    card_alias_map(
        actor=Actor.of_user(admin_user),
        alias=CardAlias.objects.get(name="h100"),
        series=HardwareSeries.objects.get(slug="h100"),
    )
    return fleet


def settled(fleet, within=30.0) -> dict:
    """The machine once Slurm calls it schedulable again, or as it is after ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        [machine] = cluster_refresh(fleet).machines
        if machine["state"] == "schedulable" or time.monotonic() > deadline:
            return machine
        time.sleep(0.5)


def refused(project, cards, now=None) -> PlacementRefused:
    with pytest.raises(PlacementRefused) as refusal:
        admit_automatically(project, Need("train", "h100", cards), now=now)
    return refusal.value


def test_its_inventory_is_what_slurm_says_four_h100(hpc, slurm_cluster):
    [machine] = cluster_refresh(hpc).machines
    assert machine["name"] == slurm_cluster.node_name
    assert machine["cards"] == [{"name": "h100", "count": 4}]
    assert machine["state"] == "schedulable"
    assert machine["detail"]["partitions"] == [slurm_cluster.partition]


def test_unset_the_version_spoken_is_the_newest_slurm_22_05_offers_v0_0_38(hpc):
    hpc.config.pop("slurm_api_version")
    hpc.save(update_fields=["config"])
    [machine] = cluster_refresh(hpc).machines
    assert machine["detail"]["slurm_api_version"] == "v0.0.38"
    assert machine["cards"] == [{"name": "h100", "count": 4}]


def test_R10_a_job_cancelled_through_the_api_is_cancelled_in_slurm_and_read_back(
    hpc, member, member_api
):
    job = training_job_submit(
        actor=Actor.of_user(member),
        project="ml",
        name="cancel-me",
        series="h100",
        cards=1,
        script="#!/bin/sh\nsleep 300\n",
    )
    job = cluster_job_handover(job.pk)

    with tasks_run_at_once(), TestCase.captureOnCommitCallbacks(execute=True):
        assert member_api.post(f"/api/training-jobs/{job.pk}/cancel").status_code == 200

    job.refresh_from_db()
    assert job.backend_cancel_sent_at is not None  # slurmrestd's job delete taken
    deadline = time.monotonic() + 30
    while job.backend_state != "CANCELLED" and time.monotonic() < deadline:
        cluster_jobs_track()
        job.refresh_from_db()
        time.sleep(0.3)
    assert (job.backend_state, job.state) == ("CANCELLED", "cancelled")
    backend_for(hpc).cancel(job.backend_job_id)  # finished: nothing left to cancel, no error


def test_J4_an_unmapped_slurm_card_type_never_fits_a_pinned_series(
    hpc, member, admin_user, project
):
    card_alias_map(
        actor=Actor.of_user(admin_user), alias=CardAlias.objects.get(name="h100"), series=None
    )
    assert refused(project, 2).reason == "inventory_fit"


def test_P7_two_h100_are_admitted_handed_to_slurm_and_run_to_completed(hpc, member, project):
    job = training_job_submit(
        actor=Actor.of_user(member),
        project="ml",
        name="finetune",
        series="h100",
        cards=2,
        script="#!/bin/sh\nsleep 1\n",
    )
    assert job.fleet_id == "hpc" and job.admission["fits_on"]
    job = cluster_job_handover(job.pk)
    assert job.backend_job_id.isdigit(), job.backend_error
    assert cluster_job_handover(job.pk).backend_job_id == job.backend_job_id  # at most once
    deadline = time.monotonic() + 60
    while job.backend_state != "COMPLETED" and time.monotonic() < deadline:
        cluster_jobs_track()
        job.refresh_from_db()
        time.sleep(0.5)
    assert job.backend_state == "COMPLETED"
    states = list(
        AuditEvent.objects.filter(action="trainingjob.backend_state")
        .order_by("pk")
        .values_list("after__backend_state", flat=True)
    )
    assert states[-1] == "COMPLETED" and len(states) == len(set(states))


def slurm_jobs_with_comment(slurm_cluster, comment: str) -> list[str]:
    jobs = httpx.get(
        f"{slurm_cluster.url}/slurm/v0.0.38/jobs", headers=slurm_cluster.headers, timeout=10
    ).json()["jobs"]
    return [str(job["job_id"]) for job in jobs if job.get("comment") == comment]


def test_P7_a_handover_that_died_after_slurm_took_the_job_is_resumed_never_submitted_twice(
    hpc, member, slurm_cluster
):
    job = training_job_submit(
        actor=Actor.of_user(member),
        project="ml",
        name="resume-me",
        series="h100",
        cards=1,
        script="#!/bin/sh\nsleep 1\n",
    )
    # As a crashed attempt leaves it: marked and keyed, Slurm given the job, nothing recorded.
    TrainingJob.objects.filter(pk=job.pk).update(
        handover_key="tp-crashed0001", handover_started_at=timezone.now() - timedelta(minutes=2)
    )
    job.refresh_from_db()
    taken = backend_for(hpc).submit(_spec(job))

    cluster_jobs_track()

    job.refresh_from_db()
    assert job.backend_job_id == taken and job.handover_started_at is None
    assert slurm_jobs_with_comment(slurm_cluster, "tp-crashed0001") == [taken]
    event = AuditEvent.objects.get(action="trainingjob.handed_over", target_id=str(job.pk))
    assert event.after["resumed"] is True and event.after["key"] == "tp-crashed0001"


class AnswerLost:
    """slurmrestd behind a proxy that passes every request on, and for the first job
    submission drops the connection instead of the answer: Slurm took the job, the console
    never heard."""

    def __init__(self, upstream: str):
        self.upstream, self.dropped = upstream, 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                answer = httpx.request(
                    self.command,
                    proxy.upstream + self.path,
                    content=body,
                    headers={
                        k: v
                        for k, v in self.headers.items()
                        if k.lower().startswith("x-slurm") or k.lower() == "content-type"
                    },
                    timeout=10,
                )
                if self.path.endswith("/job/submit") and not proxy.dropped:
                    proxy.dropped += 1
                    self.connection.shutdown(socket.SHUT_RDWR)  # taken; the answer lost
                    return
                self.send_response(answer.status_code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = _forward

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_P7_a_submission_whose_answer_was_lost_is_resumed_not_failed_nor_repeated(
    hpc, member, slurm_cluster
):
    proxy = AnswerLost(slurm_cluster.url)
    try:
        Fleet.objects.filter(pk=hpc.pk).update(config={**hpc.config, "slurm_rest_url": proxy.url})
        job = training_job_submit(
            actor=Actor.of_user(member),
            project="ml",
            name="answer-lost",
            series="h100",
            cards=1,
            script="#!/bin/sh\nsleep 1\n",
        )

        job = cluster_job_handover(job.pk)
        job.refresh_from_db()
        assert proxy.dropped == 1
        assert (job.backend_job_id, job.backend_error) == ("", "")  # unknown, not failed
        [taken] = slurm_jobs_with_comment(slurm_cluster, job.handover_key)

        cluster_jobs_track()  # the next pass resumes it

        job.refresh_from_db()
        assert job.backend_job_id == taken
        assert slurm_jobs_with_comment(slurm_cluster, job.handover_key) == [taken]
    finally:
        proxy.close()


def test_P7_a_handover_under_way_is_left_to_its_worker(hpc, member, slurm_cluster):
    job = training_job_submit(
        actor=Actor.of_user(member),
        project="ml",
        name="under-way",
        series="h100",
        cards=1,
        script="#!/bin/sh\nsleep 1\n",
    )
    TrainingJob.objects.filter(pk=job.pk).update(
        handover_key="tp-underway0001", handover_started_at=timezone.now()
    )

    cluster_jobs_track()

    job.refresh_from_db()
    assert job.backend_job_id == "" and job.handover_started_at is not None
    assert slurm_jobs_with_comment(slurm_cluster, "tp-underway0001") == []


def test_P6_eight_h100_are_refused_with_the_largest_fit_that_exists(hpc, member, project):
    refusal = refused(project, 8)
    assert refusal.reason == "inventory_fit"
    assert refusal.details["best_offer"] == "largest fit: 4 × h100 on one node in hpc"


def test_D1_a_node_drained_in_slurm_stops_fitting_and_shows_as_not_made_by_the_console(
    hpc, member, slurm_cluster, admin_client, project
):
    node = slurm_cluster.node_name
    slurm_cluster.scontrol("update", f"NodeName={node}", "State=DRAIN", "Reason=test-drain")
    try:
        [machine] = cluster_refresh(hpc).machines
        assert (machine["state"], machine["reason"]) == ("cordoned", "Slurm drain: test-drain")
        assert refused(project, 2).reason == "inventory_fit"
        page = admin_client.get("/admin/fleets/fleet/hpc/change/").content.decode()
        assert "test-drain" in page and "not made by the console" in page
    finally:
        slurm_cluster.scontrol("update", f"NodeName={node}", "State=RESUME")
    # Resumed, Slurm pings slurmd first (NOT_RESPONDING meanwhile: gone, to the console).
    assert settled(hpc)["state"] == "schedulable"
    assert admit_automatically(project, Need("train", "h100", 2)).fleet_id == "hpc"


def test_D1_a_draining_slurm_fleet_takes_no_new_work_and_slurm_is_untouched(
    hpc, member, slurm_cluster, project
):
    hpc.state = "draining"
    hpc.save(update_fields=["state"])
    assert refused(project, 2).reason == "state"
    assert "DRAIN" not in slurm_cluster.scontrol("show", "node", slurm_cluster.node_name)


def test_L1_slurmrestd_gone_ages_the_fleet_out_of_placement_with_the_error_shown(
    hpc, member, slurm_cluster, admin_client, settings, project
):
    read = cluster_refresh(hpc)
    slurm_cluster.stop_restd()
    try:
        failed = cluster_refresh(hpc)
        assert failed.observed_at == read.observed_at and "did not answer" in failed.error
        window = timedelta(seconds=settings.TUNEPLANE_PLACEMENT_FRESHNESS)
        within = read.observed_at + window - timedelta(seconds=1)
        assert admit_automatically(project, Need("train", "h100", 2), now=within).fleet_id == "hpc"
        assert (
            refused(project, 2, now=read.observed_at + window + timedelta(seconds=1)).reason
            == "inventory_fit"
        )
        page = admin_client.get("/admin/fleets/fleet/hpc/change/").content.decode()
        assert "unreachable" in page and "did not answer" in page
        assert AuditEvent.objects.filter(action="fleet.cluster_unreachable").count() == 1
    finally:
        slurm_cluster.start_restd()
    hpc.config["slurm_rest_url"] = slurm_cluster.url
    hpc.save(update_fields=["config"])
    assert cluster_refresh(hpc).error == ""
    assert AuditEvent.objects.filter(action="fleet.cluster_reachable").count() == 1


def test_a_bad_token_is_an_error_that_names_no_token(hpc, monkeypatch, slurm_cluster):
    monkeypatch.setenv(TOKEN_ENV, "not-a-jwt")
    snapshot = cluster_refresh(hpc)
    assert "500" in snapshot.error and "22.05" in snapshot.error
    assert "not-a-jwt" not in snapshot.error and slurm_cluster.token not in snapshot.error
