"""When hardware fails (DESIGN §9, H1–H3) on a node Fleet, in process on the real database:
a node's reports go through the service the gateway calls, a card's fault through the one
telemetry calls; the pure decisions are tests/placement/test_faults.py."""

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import Actor
from fleets import services as fleet_services
from nodes.models import Node, NodeCommand
from nodes.services.commands import Reported, node_command_report, node_commands_reconcile
from nodes.services.health import node_cards_health
from placement.models import Attempt, Member, TrainingJob, Volume
from placement.runspec import checked_run
from placement.services import runs, storage
from placement.services.allocator import allocate
from placement.services.reconcile import members_reconcile
from placement.services.starts import checkpoint_dir
from tests.conftest import SYSTEM
from tuneplane.errors import ValidationFailed

from .test_allocator import job


@pytest.fixture
def no_backoff(settings):
    """The retries below are placed at once: the backoff itself is asserted where it is."""
    settings.TUNEPLANE_INFRA_BACKOFF_FIRST = 0


def members(record, number=None) -> list[Member]:
    found = Member.objects.filter(attempt__training_job=record).order_by("attempt__number", "rank")
    return list(found if number is None else found.filter(attempt__number=number))


def attempt(record, number) -> Attempt:
    return Attempt.objects.get(training_job=record, number=number)


def report(member: Member, state="running", code=None, reason="", **more) -> None:
    node_command_report(
        node_id=member.node_id, reported=Reported(member.command_id, state, code, reason, **more)
    )


def vanish(member: Member) -> None:
    """It runs; its node goes away and comes back not knowing it (R8)."""
    report(member)
    Node.objects.filter(pk=member.node_id).update(scheduling_state="gone")
    members_reconcile()
    Node.objects.filter(pk=member.node_id).update(scheduling_state="schedulable")
    node_commands_reconcile(node_id=member.node_id, reported=[])


def fresh(record) -> TrainingJob:
    return TrainingJob.objects.get(pk=record.pk)


def test_H1_H2_a_vanished_member_is_infrastructure_and_spends_no_attempt(
    node_fleet, two_nodes, member, no_backoff
):
    record = job(member, cards=8, max_attempts=1)
    allocate(fleet_id=node_fleet.id)
    [first] = members(record)
    vanish(first)
    ended = attempt(record, 1)
    assert (ended.state, ended.reason, ended.end_class) == ("failed", "vanished", "infrastructure")
    event = AuditEvent.objects.get(action="attempt.failed", target_id=str(ended.pk))
    assert event.after["end_class"] == "infrastructure"  # H1: audited
    now = fresh(record)
    assert (now.state, now.reason) == ("queued", "retrying after vanished")  # max_attempts 1
    assert now.excluded["nodes"][0]["node"] == first.node_id
    assert runs.attempts_used(now) == 0
    allocate(fleet_id=node_fleet.id)
    [second] = members(record, 2)
    assert second.node_id != first.node_id  # never the node that failed it (H2)


def test_H1_a_non_zero_exit_is_user_and_fails_the_job_at_once(node_fleet, gpu_node, member):
    gpu_node(node_fleet)
    record = job(member, max_attempts=3)
    allocate(fleet_id=node_fleet.id)
    [one] = members(record)
    report(one)
    report(one, "failed", 1, "exit")
    assert attempt(record, 1).end_class == "user"
    assert (fresh(record).state, fresh(record).reason) == ("failed", "exit")
    assert fresh(record).excluded == {}


def test_H1_exit_125_is_the_runtimes_under_runc_and_the_members_own_as_a_process(
    node_fleet, gpu_node, member, no_backoff
):
    gpu_node(node_fleet, cards=2)
    confined, process = job(member, max_attempts=1), job(member, max_attempts=1)
    allocate(fleet_id=node_fleet.id)
    [under_runc], [bare] = members(confined), members(process)
    report(under_runc, confinement="runc: uid 100001; pid, ipc, uts, mount, network")
    report(under_runc, "failed", 125, "exit")
    report(bare, confinement="cgroup v2: cpu, memory, pids")
    report(bare, "failed", 125, "exit")
    assert attempt(confined, 1).end_class == "infrastructure"
    assert fresh(confined).state == "queued"
    assert attempt(process, 1).end_class == "user"
    assert fresh(process).state == "failed"


def test_H1_H2_a_fatal_xid_during_the_attempt_excludes_only_that_card(
    node_fleet, gpu_node, member, no_backoff
):
    node = gpu_node(node_fleet, cards=2)
    record = job(member, cards=1, max_attempts=1)
    allocate(fleet_id=node_fleet.id)
    [one] = members(record)
    report(one)
    card = one.cards[0]
    since = timezone.now().isoformat()
    sick = {"index": card["index"], "name": "H100", "reason": "XID 79", "since": since}
    node_cards_health(node_id=node.id, unhealthy={card["uuid"]: sick}, healthy={})
    report(one, "failed", 1, "exit")  # CUDA died with the card: an exit, but not the job's
    assert attempt(record, 1).end_class == "infrastructure"
    now = fresh(record)
    assert now.state == "queued" and now.excluded["nodes"] == []
    assert [(c["node"], c["uuid"]) for c in now.excluded["cards"]] == [(node.id, card["uuid"])]
    # The card comes back healthy: still never this job's (until an operator clears it).
    node_cards_health(node_id=node.id, unhealthy={}, healthy={card["uuid"]: "quiet"})
    report(one, "failed", 1, "exit", cleaned=True)
    allocate(fleet_id=node_fleet.id)
    [second] = members(record, 2)
    assert second.node_id == node.id and second.cards[0]["uuid"] != card["uuid"]


def test_H1_a_gang_peers_vanishing_is_the_gangs_infrastructure_end(
    node_fleet, two_nodes, member, no_backoff
):
    gang = job(member, cards=8, nodes=2, max_attempts=1)
    allocate(fleet_id=node_fleet.id)
    rank0, rank1 = members(gang)
    report(rank0)
    vanish(rank1)
    assert attempt(gang, 1).end_class == "infrastructure"
    assert [e["node"] for e in fresh(gang).excluded["nodes"]] == [rank1.node_id]


def test_H2_backoff_doubles_and_the_job_waits_backoff_meanwhile(node_fleet, two_nodes, member):
    record = job(member, cards=8)
    allocate(fleet_id=node_fleet.id)
    [one] = members(record)
    before = timezone.now()
    vanish(one)
    waits_until = fresh(record).not_before
    assert timedelta(seconds=29) < waits_until - before < timedelta(seconds=35)
    assert allocate(fleet_id=node_fleet.id)["allocated"] == 0
    assert fresh(record).waiting["reason"] == "backoff"
    TrainingJob.objects.filter(pk=record.pk).update(not_before=None)
    allocate(fleet_id=node_fleet.id)
    [two] = members(record, 2)
    before = timezone.now()
    vanish(two)
    assert timedelta(seconds=59) < fresh(record).not_before - before < timedelta(seconds=65)


def test_H2_the_fleets_infra_retries_is_the_budget(node_fleet, two_nodes, member, no_backoff):
    fleet_services.fleet_update(actor=SYSTEM, fleet=node_fleet, config={"infra_retries": 1})
    record = job(member, cards=8, max_attempts=5)
    allocate(fleet_id=node_fleet.id)
    vanish(members(record, 1)[0])
    assert fresh(record).state == "queued"
    allocate(fleet_id=node_fleet.id)
    vanish(members(record, 2)[0])
    now = fresh(record)
    assert (now.state, now.reason) == ("failed", "vanished; infra_retries spent")
    assert runs.attempts_used(now) == 0  # five attempts of its own, none spent


def test_H2_an_excluded_node_is_never_used_until_an_administrator_clears_it(
    node_fleet, gpu_node, member, admin_user, no_backoff, member_api, admin_api, outsider_api
):
    node = gpu_node(node_fleet)
    record = job(member, cards=1)
    allocate(fleet_id=node_fleet.id)
    [one] = members(record)
    vanish(one)
    report(one, "failed", -1, "vanished", cleaned=True)
    assert allocate(fleet_id=node_fleet.id)["allocated"] == 0  # its one node is excluded
    path = f"/api/training-jobs/{record.pk}/clear-excluded"
    assert member_api.post(path).status_code == 403
    assert outsider_api.post(path).status_code == 404
    shown = admin_api.post(path)
    assert shown.status_code == 200 and shown.json()["excluded"] == {"nodes": [], "cards": []}
    event = AuditEvent.objects.get(action="trainingjob.excluded_cleared")
    assert event.before["excluded"]["nodes"][0]["node"] == node.id
    assert fresh(record).excluded == {}
    allocate(fleet_id=node_fleet.id)  # the pass the clear asks for once it commits
    assert members(record, 2)[0].node_id == node.id


def test_H1_H2_H3_the_api_shows_class_budget_exclusions_and_retry(
    node_fleet, two_nodes, member, member_api, no_backoff
):
    answer = member_api.post(
        "/api/training-jobs",
        {
            "project": "ml",
            "name": "resumes",
            "command": ["python", "train.py"],
            "cards": 8,
            "retry": {"on_exit_codes": [3, 75], "max_attempts": 4},
        },
    )
    assert answer.status_code == 201, answer.json()
    assert answer.json()["retry"] == {"on_exit_codes": [3, 75], "max_attempts": 4}
    record = TrainingJob.objects.get(pk=answer.json()["id"])
    allocate(fleet_id=node_fleet.id)
    vanish(members(record, 1)[0])
    shown = member_api.get(f"/api/training-jobs/{record.pk}").json()
    assert shown["attempts"][0]["end_class"] == "infrastructure"
    assert shown["infra_retries"] == {"used": 1, "budget": 10}
    assert shown["excluded"]["nodes"][0]["node"] == members(record, 1)[0].node_id


@pytest.mark.parametrize(
    ("retry", "field"),
    [
        ({"on_exit_codes": [0]}, "retry.on_exit_codes"),
        ({"on_exit_codes": [256]}, "retry.on_exit_codes"),
        ({"on_exit_codes": "3"}, "retry.on_exit_codes"),
        ({"on_exit_codes": [True]}, "retry.on_exit_codes"),
        ({"max_attempts": 0}, "retry.max_attempts"),
        ({"max_attempts": 11}, "retry.max_attempts"),
        ({"on_exit": [3]}, "retry.on_exit"),
        ([3], "retry"),
    ],
)
def test_H3_a_bad_retry_is_refused_naming_its_field(retry, field):
    with pytest.raises(ValidationFailed) as refused:
        checked_run(command=["true"], retry=retry)
    assert refused.value.field == field


def test_H3_retry_max_attempts_and_max_attempts_agree_or_are_refused():
    run = checked_run(command=["true"], retry={"on_exit_codes": [3, 3, 1], "max_attempts": 5})
    assert (run["retry_on_exit_codes"], run["max_attempts"]) == ([1, 3], 5)
    assert checked_run(command=["true"], max_attempts=5, retry={"max_attempts": 5})
    with pytest.raises(ValidationFailed) as refused:
        checked_run(command=["true"], max_attempts=2, retry={"max_attempts": 5})
    assert refused.value.field == "retry.max_attempts"
    assert checked_run(command=["true"])["retry_on_exit_codes"] == []


def test_H3_a_listed_exit_code_retries_counted_and_another_fails_at_once(
    node_fleet, gpu_node, member
):
    gpu_node(node_fleet)
    record = job(member, retry={"on_exit_codes": [3], "max_attempts": 2})
    for number, code in ((1, 3), (2, 3)):
        allocate(fleet_id=node_fleet.id)
        [one] = members(record, number)
        report(one)
        report(one, "failed", code, "exit", cleaned=True)
        assert attempt(record, number).end_class == "user"
    now = fresh(record)
    assert (now.state, now.reason) == ("failed", "exit")  # the second spent max_attempts 2
    assert Attempt.objects.filter(training_job=record).count() == 2
    other = job(member, retry={"on_exit_codes": [3]})
    allocate(fleet_id=node_fleet.id)
    [one] = members(other)
    report(one)
    report(one, "failed", 4, "exit")
    assert fresh(other).state == "failed"


def test_H3_every_attempt_is_told_its_number_its_restarts_and_its_checkpoint_dir(
    node_fleet, two_nodes, member, no_backoff
):
    actor = Actor.of_user(member)
    storage.storage_create(Volume, actor=actor, project="ml", name="ckpt", uri="s3://b/ckpt/")
    record = job(member, cards=8, volumes=["ckpt"])
    allocate(fleet_id=node_fleet.id)
    vanish(members(record, 1)[0])
    allocate(fleet_id=node_fleet.id)
    starts = [
        NodeCommand.objects.get(pk=m.command_id).payload for m in members(record)
    ]  # the first attempt's and the retry's
    assert [
        (s["labels"]["TUNEPLANE_ATTEMPT"], s["labels"]["TUNEPLANE_RESTART_COUNT"]) for s in starts
    ] == [
        (1, 0),
        (2, 1),
    ]
    where = f"ml/volumes/ckpt/checkpoints/trainingjob-{record.pk}"
    assert {s["delivery"]["env"]["TUNEPLANE_CHECKPOINT_DIR"] for s in starts} == {where}
    record.fleet.delivery = "object-pull"  # the same job on an object-pull Fleet: its URI
    assert checkpoint_dir(record) == f"s3://b/ckpt/checkpoints/trainingjob-{record.pk}"


def test_H3_no_volume_no_checkpoint_dir_and_the_names_are_not_the_jobs_to_set(
    member, node_fleet, gpu_node
):
    gpu_node(node_fleet)
    record = job(member)
    assert checkpoint_dir(record) == ""
    for name in ("TUNEPLANE_ATTEMPT", "TUNEPLANE_RESTART_COUNT", "TUNEPLANE_CHECKPOINT_DIR"):
        with pytest.raises(ValidationFailed) as refused:
            checked_run(command=["true"], env={name: "1"})
        assert refused.value.field == f"env.{name}"


@pytest.mark.parametrize("value", [-1, 101, "3", True, 2.5])
def test_H2_a_fleets_infra_retries_is_a_whole_number_from_0_to_100(make_fleet, value):
    with pytest.raises(ValidationFailed) as refused:
        make_fleet("bad", kind="node", config={"infra_retries": value})
    assert "infra_retries" in refused.value.message
    assert make_fleet("good", kind="node", config={"infra_retries": 0}).config == {
        "infra_retries": 0
    }
