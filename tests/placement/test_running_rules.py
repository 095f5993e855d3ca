"""Clauses of the running-work rules that no other test held (issue 40), each in process on
the real database, deterministic, and named for its rule: a mix of a pinned and an any-card
request in one pass (R1), admission order across kinds (R2), budgets across passes (R5),
attempts used up (R9), the gang deadline's one audit event (R10, A1), a report in the middle
of a rollout (S2), a session's members cleaned as a real agent cleans them (S4), an episode
stuck starting (S5), a single node quiet for env (S6)."""

from datetime import timedelta

from django.utils import timezone

from audit.models import AuditEvent
from audit.services import Actor
from nodes.choices import CommandKind
from nodes.models import Node, NodeCommand
from nodes.services.commands import Reported, node_command_report
from placement.models import Attempt, CardHold, Member, PlaygroundSession, TrainingJob
from placement.services import episodes, playground, serving, submission
from placement.services.allocator import allocate
from placement.services.reconcile import members_reconcile
from tests.conftest import SERVE, SYSTEM

GIB = 2**30


def submit(user, model="training", **fields):
    submit = (
        submission.training_job_submit if model == "training" else submission.lifecycle_job_submit
    )
    extra = {} if model == "training" else {"kind": "export"}
    return submit(
        actor=Actor.of_user(user), project="ml", name="job", command=["true"], **extra, **fields
    )


def members_of(record) -> list[Member]:
    return list(
        Member.objects.filter(
            **{f"attempt__{record._meta.model_name.replace('job', '_job')}": record}
        )
    )


def report(member: Member, state: str = "running", exit_code=None, reason="", **fields):
    node_command_report(
        node_id=member.node_id,
        reported=Reported(member.command_id, state, exit_code, reason, **fields),
    )


def test_R1_a_pinned_and_an_any_card_job_in_one_pass_get_two_different_cards(
    node_fleet, gpu_node, member
):
    gpu_node(node_fleet, cards=2)
    pinned = submit(member, series="h100", cards=1)
    anywhere = submit(member, cards=1)
    assert allocate(fleet_id=node_fleet.id) == {"allocated": 2, "waiting": 0, "preempted": 0}
    [one], [other] = members_of(pinned), members_of(anywhere)
    assert one.cards != other.cards and CardHold.objects.count() == 2


def test_R2_a_lifecycle_job_admitted_first_is_offered_the_cards_before_a_training_job(
    node_fleet, gpu_node, member
):
    gpu_node(node_fleet, cards=8)
    first = submit(member, model="lifecycle", cards=8)
    second = submit(member, cards=8)
    allocate(fleet_id=node_fleet.id)
    assert [len(members_of(first)), len(members_of(second))] == [1, 0]
    assert TrainingJob.objects.get(pk=second.pk).state == "queued"


def test_R2_a_replica_admitted_first_is_offered_the_cards_before_a_training_job(
    node_fleet, gpu_node, member
):
    node_fleet.capabilities = ["train", "serve"]
    node_fleet.save(update_fields=["capabilities"])
    gpu_node(node_fleet, cards=8)
    deployment = submission.deployment_submit(
        actor=Actor.of_user(member), project="ml", name="chat", cards=8, **SERVE
    )
    later = submit(member, cards=8)
    allocate(fleet_id=node_fleet.id)
    assert Member.objects.filter(revision__deployment=deployment).count() == 1
    assert members_of(later) == []


def test_R5_two_jobs_of_300_gib_on_a_512_gib_node_do_not_both_start_across_passes(
    node_fleet, gpu_node, member
):
    gpu_node(node_fleet, cards=8)  # memory_budget_bytes: 512 GiB
    first = submit(member, cards=1, memory_bytes=300 * GIB)
    assert allocate(fleet_id=node_fleet.id)["allocated"] == 1
    second = submit(member, cards=1, memory_bytes=300 * GIB)
    assert allocate(fleet_id=node_fleet.id) == {"allocated": 0, "waiting": 1, "preempted": 0}
    assert len(members_of(first)) == 1 and members_of(second) == []


def exits(record, number: int, code: int = 3) -> None:
    """The attempt's member runs and exits ``code`` on its own (a user end, H1)."""
    [one] = Member.objects.filter(attempt__training_job=record, attempt__number=number)
    report(one)
    report(one, "failed", code, "exit", cleaned=True)


def test_R9_H3_with_one_attempt_a_retried_exit_code_fails_the_job(node_fleet, gpu_node, member):
    gpu_node(node_fleet)
    record = submit(member, cards=1, max_attempts=1, retry={"on_exit_codes": [3]})
    allocate(fleet_id=node_fleet.id)
    exits(record, 1)
    record.refresh_from_db()
    assert (record.state, record.reason) == ("failed", "exit")
    assert allocate(fleet_id=node_fleet.id)["allocated"] == 0


def test_R9_H3_with_three_attempts_a_fourth_is_never_made(node_fleet, gpu_node, member):
    gpu_node(node_fleet)
    record = submit(member, cards=1, max_attempts=3, retry={"on_exit_codes": [3]})
    for number in (1, 2, 3):
        assert allocate(fleet_id=node_fleet.id)["allocated"] == 1
        exits(record, number)
    record.refresh_from_db()
    assert (record.state, record.reason) == ("failed", "exit")
    assert allocate(fleet_id=node_fleet.id)["allocated"] == 0
    assert Attempt.objects.filter(training_job=record).count() == 3


def test_R10_A1_a_missed_gang_deadline_is_one_attempt_failed_event_naming_it(
    two_nodes, node_fleet, member
):
    gang = submit(member, cards=8, nodes=2, gang_deadline_seconds=30)
    allocate(fleet_id=node_fleet.id)
    report(Member.objects.get(attempt__training_job=gang, rank=0))
    members_reconcile(now=timezone.now() + timedelta(seconds=31))
    members_reconcile(now=timezone.now() + timedelta(seconds=62))  # a second pass: no more
    attempt = Attempt.objects.get(training_job=gang)
    [event] = AuditEvent.objects.filter(action="attempt.failed", target_id=str(attempt.pk))
    assert event.after["reason"] == "gang_deadline" and event.before["state"] == "starting"


def replicas(deployment, number) -> list[Member]:
    return list(
        Member.objects.filter(revision__deployment=deployment, revision__number=number).order_by(
            "rank"
        )
    )


def stops(members) -> int:
    return NodeCommand.objects.filter(
        kind=CommandKind.STOP, payload__member__in=[m.command_id for m in members]
    ).count()


def test_S2_a_stopped_old_replica_reporting_its_exit_stops_no_second_one_early(
    node_fleet, gpu_node, member
):
    node_fleet.capabilities = ["serve"]
    node_fleet.save(update_fields=["capabilities"])
    for n in (1, 2, 3, 4):
        gpu_node(node_fleet, address=f"10.0.0.{n}:1")
    deployment = submission.deployment_submit(
        actor=Actor.of_user(member), project="ml", name="chat", replicas=2, **SERVE
    )
    allocate(fleet_id=node_fleet.id)
    old = replicas(deployment, 1)
    for replica in old:
        report(replica, ready=True)
    serving.revision_create(actor=SYSTEM, deployment=deployment, env={"V": "2"})
    allocate(fleet_id=node_fleet.id)
    new = replicas(deployment, 2)
    report(new[0], ready=True)  # one new Ready: one old stops
    assert stops(old) == 1
    stopped = next(m for m in old if stops([m]))
    report(stopped, "failed", -15, "stopped")  # its exit, reported mid-rollout
    report(stopped, "failed", -15, "stopped", cleaned=True)
    assert stops(old) == 1, "a second old replica stopped with one new Ready (S2)"
    report(new[1], ready=True)
    assert stops(old) == 2


def test_S4_a_sessions_member_is_sent_a_cleanup_after_its_stop_as_a_real_agent_needs(
    node_fleet, gpu_node, member
):
    node_fleet.capabilities = ["serve"]
    node_fleet.save(update_fields=["capabilities"])
    gpu_node(node_fleet)
    session = submission.playground_session_submit(
        actor=Actor.of_user(member), project="ml", name="try", ttl_seconds=60, **SERVE
    )
    allocate(fleet_id=node_fleet.id)
    [process] = Member.objects.filter(session=session)
    report(process, ready=True)
    playground.sessions_expire(now=timezone.now() + timedelta(seconds=61))
    # The agent ends the process on the stop and reports it; it cleans up only when told.
    report(process, "failed", -15, "stopped")
    cleanups = NodeCommand.objects.filter(
        kind=CommandKind.CLEANUP, payload__member=process.command_id
    )
    assert cleanups.count() == 1
    report(process, "failed", -15, "stopped", cleaned=True)
    process.refresh_from_db()
    assert (process.state, process.cleanup) == ("cancelled", "cleaned")
    assert not CardHold.objects.filter(member=process).exists()
    assert PlaygroundSession.objects.get(pk=session.pk).state == "stopped"


def test_S5_an_episode_stuck_starting_ends_timed_out_at_its_timeout(node_fleet, gpu_node, member):
    node_fleet.capabilities = ["env"]
    node_fleet.save(update_fields=["capabilities"])
    gpu_node(node_fleet)
    environment = submission.environment_submit(
        actor=Actor.of_user(member), project="ml", name="env", manifest={"fleet": node_fleet.id}
    )
    episode = episodes.episode_start(
        actor=SYSTEM, environment=environment, command=["x"], timeout_seconds=30
    )
    allocate(fleet_id=node_fleet.id)
    episode.refresh_from_db()
    assert episode.state == "starting"  # its node never reports it
    assert episodes.episodes_time_out(now=timezone.now() + timedelta(seconds=20))["timed_out"] == 0
    assert episodes.episodes_time_out(now=timezone.now() + timedelta(seconds=31))["timed_out"] == 1
    episode.refresh_from_db()
    assert episode.state == "timed_out"
    assert stops(Member.objects.filter(episode=episode)) == 1


def test_S6_a_single_node_quiet_for_env_gets_no_new_episode(node_fleet, gpu_node, member):
    node_fleet.capabilities = ["env"]
    node_fleet.save(update_fields=["capabilities"])
    quiet = gpu_node(node_fleet)
    Node.objects.filter(pk=quiet.pk).update(quiet_env=True)
    environment = submission.environment_submit(
        actor=Actor.of_user(member), project="ml", name="env", manifest={"fleet": node_fleet.id}
    )
    episodes.episode_start(actor=SYSTEM, environment=environment, command=["x"])
    assert allocate(fleet_id=node_fleet.id) == {"allocated": 0, "waiting": 1, "preempted": 0}
    Node.objects.filter(pk=quiet.pk).update(quiet_env=False)
    assert allocate(fleet_id=node_fleet.id)["allocated"] == 1
