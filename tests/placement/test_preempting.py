"""Preemption on the real database (DESIGN §8 Q4–Q8): the allocator's pass chooses victims
for what waits within its guarantee or at a higher priority, stops them through the agent's
own stop with the preemption grace, records who preempted whom and why, and queues each
victim again in its place once its members have ended — never a failure, never an attempt
used — and the cards go back only after the cleanup (R7). Which jobs are victims, without a
database, is test_preemption.py's."""

from datetime import timedelta

import pytest
from django.test import Client, override_settings
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import Actor
from nodes.choices import CommandKind
from nodes.models import NodeCommand
from placement.models import Attempt, CardHold, Member, TrainingJob
from placement.services import runs
from placement.services.allocator import allocate, allocate_preview
from tests.conftest import Api
from tests.placement.test_quotas import QUOTAS, submit
from tests.placement.test_running_rules import exits, report
from tests.tuneplane.test_metrics import scrape, value
from tuneplane.errors import ValidationFailed
from tuneplane.models import Project


@pytest.fixture
def lab(node_fleet, gpu_node):
    gpu_node(node_fleet)
    return node_fleet


@pytest.fixture
def shared(lab, admin_api, member, vision):
    """cv is guaranteed the node's 8 cards; ml has no guarantee and borrows."""
    response = admin_api.request(
        "PUT", QUOTAS, {"quotas": [{"project": "cv", "guaranteed": 8}, {"project": "ml"}]}
    )
    assert response.status_code == 200, response.content
    return lab


def running_for(job, seconds: int) -> list[Member]:
    """The job's latest attempt placed, every member reported running, started ``seconds``
    ago (its attempt's start is what the minimum runtime is measured from, Q5)."""
    members = list(Member.objects.filter(attempt__training_job=job).order_by("rank"))
    for member in members:
        report(member)
    Attempt.objects.filter(training_job=job).update(
        started_at=timezone.now() - timedelta(seconds=seconds)
    )
    assert fresh(job).state == "running"
    return members


def fresh(job) -> TrainingJob:
    return TrainingJob.objects.get(pk=job.pk)


def stops(members) -> list[NodeCommand]:
    return list(
        NodeCommand.objects.filter(
            kind=CommandKind.STOP, payload__member__in=[m.command_id for m in members]
        )
    )


def borrowed_job_running(shared, member, seconds=3600, **fields):
    job = submit(member, "ml", "borrower", cards=8, **fields)
    allocate(fleet_id=shared.id)
    assert Member.objects.get(attempt__training_job=job).borrowed
    return job, running_for(job, seconds)


def test_Q5_Q6_Q7_Q8_work_within_its_guarantee_preempts_borrowed_work(
    shared, member, vision, member_api
):
    victim, members = borrowed_job_running(shared, member)
    owner = submit(vision, "cv", "owner", cards=8)

    assert allocate(fleet_id=shared.id)["preempted"] == 1
    victim = fresh(victim)
    assert (victim.state, victim.reason) == ("preempting", "preempted")
    assert victim.preemption["by"] == f"trainingjob-{owner.pk}"
    assert "within its guarantee" in victim.preemption["why"]
    [stop] = stops(members)
    assert stop.payload["grace_seconds"] == 120  # TUNEPLANE_PREEMPT_GRACE (Q6)
    # Q7: one event on the victim naming its preemptor and why, one on the preemptor.
    on_victim = AuditEvent.objects.get(action="trainingjob.preempting")
    assert on_victim.target_id == str(victim.pk)
    assert on_victim.after["preemption"]["by"] == f"trainingjob-{owner.pk}"
    on_owner = AuditEvent.objects.get(action="trainingjob.preempts")
    assert on_owner.target_id == str(owner.pk)
    assert [v["job"] for v in on_owner.after["victims"]] == [f"trainingjob-{victim.pk}"]
    # Q8: the preemptor waits for its victims, their deadlines its numbers.
    waiting = member_api.get(f"/api/training-jobs/{victim.pk}").json()
    assert waiting["state"] == "preempting" and waiting["preemption"]["deadline"]
    owner_waits = fresh(owner).waiting
    assert owner_waits["reason"] == "preempting"
    assert owner_waits["numbers"]["victims"] == [
        {
            "job": f"trainingjob-{victim.pk}",
            "deadline": victim.preemption["deadline"],
            "project": victim.project_id,  # whose, for what a reader is shown (R23)
        }
    ]

    # A second pass while the victim stops preempts nothing more and places nothing.
    assert allocate(fleet_id=shared.id) == {"allocated": 0, "waiting": 1, "preempted": 0}
    assert AuditEvent.objects.filter(action="trainingjob.preempting").count() == 1

    # Its member stops (SIGTERM honoured): the attempt ends preempted, the job is queued.
    [stopped] = members
    report(stopped, "failed", -15, "stopped")
    victim = fresh(victim)
    attempt = Attempt.objects.get(training_job=victim)
    assert (attempt.state, attempt.reason) == ("preempted", "preempted")
    assert (victim.state, victim.reason) == ("queued", "preempted")
    assert runs.attempts_used(victim) == 0  # never counted against max_attempts (Q6)
    # R7: its cards are still held until its node confirms the cleanup.
    assert CardHold.objects.filter(member__attempt__training_job=victim).count() == 8
    assert allocate(fleet_id=shared.id)["allocated"] == 0
    report(stopped, "failed", -15, "stopped", cleaned=True)
    assert not CardHold.objects.filter(member__attempt__training_job=victim).exists()
    assert allocate(fleet_id=shared.id)["allocated"] == 1
    assert (fresh(owner).state, fresh(victim).state) == ("starting", "queued")


def test_Q6_a_preempted_attempt_never_uses_one_of_max_attempts(shared, member, vision):
    victim, [stopped] = borrowed_job_running(
        shared, member, max_attempts=2, retry={"on_exit_codes": [3]}
    )
    owner = submit(vision, "cv", "owner", cards=8)
    allocate(fleet_id=shared.id)
    report(stopped, "failed", -15, "stopped", cleaned=True)
    allocate(fleet_id=shared.id)  # the owner runs; it ends
    [owned] = Member.objects.filter(attempt__training_job=owner)
    report(owned, "succeeded", 0, cleaned=True)
    assert fresh(owner).state == "succeeded"
    allocate(fleet_id=shared.id)  # the victim's second attempt; it exits 3 (H3: retry)
    exits(victim, 2)
    victim = fresh(victim)
    # Attempt 2 of 2 is the first that counts: it is retried, not failed.
    assert (victim.state, victim.reason) == ("queued", "retrying after exit 3")


def test_Q5_a_job_that_has_run_less_than_the_minimum_is_not_preempted(shared, member, vision):
    victim, members = borrowed_job_running(shared, member, seconds=100)
    owner = submit(vision, "cv", "owner", cards=8)
    assert allocate(fleet_id=shared.id)["preempted"] == 0
    assert fresh(victim).state == "running" and not stops(members)
    assert fresh(owner).waiting["reason"] == "capacity"
    with override_settings(TUNEPLANE_PREEMPT_MIN_RUNTIME=60):
        assert allocate(fleet_id=shared.id)["preempted"] == 1


def test_Q6_a_job_asks_for_a_shorter_grace_never_a_longer_one(shared, member, vision):
    with pytest.raises(ValidationFailed) as refused:
        submit(member, "ml", "slow", cards=8, preemption_grace_seconds=121)
    assert refused.value.field == "preemption_grace_seconds" and "Q6" in str(refused.value)
    victim, members = borrowed_job_running(shared, member, preemption_grace_seconds=5)
    submit(vision, "cv", "owner", cards=8)
    allocate(fleet_id=shared.id)
    [stop] = stops(members)
    assert stop.payload["grace_seconds"] == 5
    deadline = fresh(victim).preemption
    assert deadline["deadline"] > deadline["at"]


def test_Q5_a_higher_priority_job_of_the_project_preempts_its_preemptible_work_only(
    lab, admin_api, member
):
    Project.objects.filter(slug="ml").update(max_priority=10)
    admin_api.request("PUT", QUOTAS, {"quotas": [{"project": "ml", "guaranteed": 8}]})
    kept = submit(member, "ml", "kept", cards=4)
    willing = submit(member, "ml", "willing", cards=4, preemptible=True)
    allocate(fleet_id=lab.id)
    running_for(kept, 3600), running_for(willing, 3600)
    urgent = submit(member, "ml", "urgent", cards=4, priority=5)
    assert allocate(fleet_id=lab.id)["preempted"] == 1
    assert (fresh(kept).state, fresh(willing).state) == ("running", "preempting")
    assert "priority 5" in fresh(willing).preemption["why"]
    assert fresh(urgent).waiting["reason"] == "preempting"


def test_Q1_a_fleet_without_quotas_preempts_nothing(lab, member):
    Project.objects.filter(slug="ml").update(max_priority=10)
    low = submit(member, "ml", "low", cards=8, preemptible=True)
    allocate(fleet_id=lab.id)
    running_for(low, 3600)
    submit(member, "ml", "urgent", cards=8, priority=5)
    assert allocate(fleet_id=lab.id)["preempted"] == 0
    assert fresh(low).state == "running"


def test_Q6_a_job_cancelled_while_it_is_preempted_ends_cancelled(shared, member, vision):
    victim, [stopped] = borrowed_job_running(shared, member)
    submit(vision, "cv", "owner", cards=8)
    allocate(fleet_id=shared.id)
    runs.job_cancel(actor=Actor.of_user(member), job=fresh(victim))
    report(stopped, "failed", -15, "stopped")
    assert fresh(victim).state == "cancelled"
    assert Attempt.objects.get(training_job=victim).state == "cancelled"


@pytest.fixture
def two_nodes(node_fleet, gpu_node, admin_api, member, vision):
    """Two nodes of 8 cards; cv is guaranteed 8 of them, ml borrows."""
    for n in (1, 2):
        gpu_node(node_fleet, address=f"10.0.0.{n}:1")
    admin_api.request(
        "PUT", QUOTAS, {"quotas": [{"project": "cv", "guaranteed": 8}, {"project": "ml"}]}
    )
    return node_fleet


def test_Q5_a_guarantee_is_reclaimed_once_not_again_while_its_victims_stop(
    two_nodes, member, vision
):
    first = submit(member, "ml", "first", cards=8)
    second = submit(member, "ml", "second", cards=8)
    allocate(fleet_id=two_nodes.id)
    running_for(first, 3600), running_for(second, 3600)
    submit(vision, "cv", "owner", cards=8)
    assert allocate(fleet_id=two_nodes.id)["preempted"] == 1
    # cv's second job asks for cards its guarantee has already been promised: it borrows,
    # and borrowed work never preempts (the first owner's victim is still stopping).
    later = submit(vision, "cv", "later", cards=8)
    assert allocate(fleet_id=two_nodes.id)["preempted"] == 0
    assert sorted([fresh(first).state, fresh(second).state]) == ["preempting", "running"]
    assert fresh(later).waiting["reason"] != "preempting"


def test_Q6_a_gang_is_queued_again_only_once_every_member_has_stopped(two_nodes, member, vision):
    gang = submit(member, "ml", "gang", cards=8, nodes=2)
    allocate(fleet_id=two_nodes.id)
    members = running_for(gang, 3600)
    submit(vision, "cv", "owner", cards=8)
    assert allocate(fleet_id=two_nodes.id)["preempted"] == 1
    assert len(stops(members)) == 2  # the whole gang: a gang runs all or nothing (R3)
    report(members[0], "failed", -15, "stopped")
    assert fresh(gang).state == "preempting"  # its other member still runs
    report(members[1], "failed", -15, "stopped")
    assert (fresh(gang).state, fresh(gang).reason) == ("queued", "preempted")


def test_Q7_a_dry_run_answers_whom_it_would_preempt_writing_and_counting_nothing(
    shared, member, vision
):
    def admitted() -> float:
        figures = scrape(Client(REMOTE_ADDR="127.0.0.1"))
        return value(figures, "tuneplane_admissions_total", outcome="admitted", reason="")

    victim, members = borrowed_job_running(shared, member)
    api = Api(vision)
    events, commands, counted = AuditEvent.objects.count(), NodeCommand.objects.count(), admitted()
    body = {"project": "cv", "name": "owner", "cards": 8, "command": ["true"]}
    answer = api.post("/api/training-jobs?dry_run=true", body)
    assert answer.status_code == 200, answer.content
    allocation = answer.json()["allocation"]
    assert allocation["starts"] is False and allocation["waiting"]["reason"] == "preempting"
    # ml's job, to cv's dry run: another project's work (R23).
    assert [v["job"] for v in allocation["preempts"]] == ["another project's work"]
    assert f"trainingjob-{victim.pk}" not in answer.content.decode()
    # Nothing written: the victim runs, no stop was sent, no event recorded, none counted.
    assert fresh(victim).state == "running" and not stops(members)
    assert (AuditEvent.objects.count(), NodeCommand.objects.count()) == (events, commands)
    assert admitted() == counted
    assert api.post("/api/training-jobs", body).status_code == 201
    assert admitted() == counted + 1  # a real admission is counted


def test_Q7_the_preview_rolls_back_the_pass_it_ran_whoever_calls_it(shared, member, vision):
    victim, members = borrowed_job_running(shared, member)
    owner = submit(vision, "cv", "owner", cards=8)
    answer = allocate_preview(owner)
    assert answer["preempts"] == [
        {"job": "another project's work", "deadline": answer["preempts"][0]["deadline"]}
    ]
    assert fresh(victim).state == "running" and not stops(members)
    assert fresh(owner).waiting is None  # not even its own reason to wait was kept


def test_Q6_Q7_the_admin_shows_a_jobs_last_preemption_and_the_fleets_preempting_count(
    shared, member, vision, client, admin_user
):
    victim, _ = borrowed_job_running(shared, member)
    owner = submit(vision, "cv", "owner", cards=8)
    allocate(fleet_id=shared.id)
    client.force_login(admin_user)
    page = client.get(f"/admin/placement/trainingjob/{victim.pk}/change/").content.decode()
    assert f"for trainingjob-{owner.pk}: project cv waits for cards within its guarantee" in page
    fleet = client.get(f"/admin/fleets/fleet/{shared.pk}/change/").content.decode()
    assert "<strong>1</strong> preempting" in fleet


def test_Q7_a_deployments_dry_run_answers_where_its_replicas_would_start(lab, member, member_api):
    from tests.conftest import SERVE

    body = {"project": "ml", "name": "chat", "cards": 2, "replicas": 2, **SERVE}
    answer = member_api.post("/api/deployments?dry_run=true", body)
    assert answer.status_code == 200, answer.content
    allocation = answer.json()["allocation"]
    [node] = lab.nodes.values_list("id", flat=True)
    assert (allocation["starts"], allocation["nodes"], allocation["preempts"]) == (
        True,
        [node],
        [],
    )
    # Its second replica would wait: one node, and its port is taken there by the first (S1).
    waiting = allocation["waiting"]
    assert waiting["reason"] == "capacity" and "port" in waiting["message"]
    assert not Member.objects.exists()
