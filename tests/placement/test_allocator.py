"""The allocator (DESIGN §7, R1–R3, R7): which nodes and which cards, in process, on the
real database. The race between two allocators in two processes is test_allocator_race.py;
jobs running on real agents are tests/e2e/test_jobs.py."""

from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.services import Actor
from fleets.choices import FleetState
from fleets.models import Fleet
from nodes.choices import CommandKind
from nodes.models import Node, NodeCommand
from nodes.services.cordons import node_cordon
from placement.models import Attempt, CardHold, Member, TrainingJob
from placement.services import submission
from placement.services.allocator import allocate
from tests.conftest import SYSTEM


@pytest.fixture
def lab(node_fleet, gpu_node):
    gpu_node(node_fleet)
    return node_fleet


def job(member, name="job", cards=1, **fields) -> TrainingJob:
    return submission.training_job_submit(
        actor=Actor.of_user(member),
        project="ml",
        name=name,
        command=["python", "train.py"],
        cards=cards,
        **fields,
    )


def held(job_record) -> list[dict]:
    return [
        card
        for member in Member.objects.filter(attempt__training_job=job_record)
        for card in member.cards
    ]


def states(*jobs) -> list[str]:
    return [TrainingJob.objects.get(pk=j.pk).state for j in jobs]


def test_R1_a_job_gets_specific_cards_of_its_node_each_held_by_one_row(lab, member):
    first, second = job(member, "a", cards=3), job(member, "b", cards=5)
    assert allocate(fleet_id=lab.id) == {"allocated": 2, "waiting": 0, "preempted": 0}
    cards = held(first) + held(second)
    devices = {(d["index"], d["uuid"]) for d in Node.objects.get().inventory["devices"]}
    assert {(c["index"], c["uuid"]) for c in cards} == devices  # all 8, each once
    assert CardHold.objects.count() == 8
    command = NodeCommand.objects.get(member__attempt__training_job=first)
    assert (command.kind, command.payload["cards"]) == (CommandKind.START, held(first))
    assert states(first, second) == ["starting", "starting"]


def test_R1_never_more_than_a_node_has(lab, member):
    jobs = [job(member, f"j{n}", cards=3) for n in range(3)]
    assert allocate(fleet_id=lab.id) == {"allocated": 2, "waiting": 1, "preempted": 0}
    assert states(*jobs) == ["starting", "starting", "queued"]
    assert CardHold.objects.count() == 6


def test_R1_the_database_refuses_one_card_to_two_members(lab, member):
    job(member, cards=1)
    allocate(fleet_id=lab.id)
    hold = CardHold.objects.get()
    with pytest.raises(IntegrityError), transaction.atomic():
        CardHold.objects.create(
            node_id=hold.node_id, index=hold.index, uuid=hold.uuid, member=hold.member
        )


@pytest.mark.parametrize(
    "unplaceable", ["cordoned", "draining", "quiet", "no_lease", "fleet_draining"]
)
def test_R1_only_placeable_nodes_of_an_active_fleet_get_cards(lab, member, unplaceable):
    waiting = job(member, cards=1)
    node = Node.objects.get()
    if unplaceable == "cordoned":
        node_cordon(actor=SYSTEM, node=node, reason="maintenance")
    elif unplaceable == "draining":
        Node.objects.filter(pk=node.pk).update(scheduling_state="draining")
    elif unplaceable == "quiet":
        Node.objects.filter(pk=node.pk).update(quiet_train=True)
    elif unplaceable == "no_lease":
        Node.objects.filter(pk=node.pk).update(lease_expires_at=timezone.now())
    else:
        Fleet.objects.filter(pk=lab.id).update(state=FleetState.DRAINING)
    assert allocate(fleet_id=lab.id)["allocated"] == 0
    assert states(waiting) == ["queued"] and not CardHold.objects.exists()


def test_R7_cards_stay_held_after_the_exit_until_cleanup_is_confirmed(lab, member):
    from nodes.services.commands import Reported, node_command_report

    first = job(member, "first", cards=8)
    allocate(fleet_id=lab.id)
    command = NodeCommand.objects.get(member__attempt__training_job=first)
    node_command_report(node_id=command.node_id, reported=Reported(command.id, "running"))
    node_command_report(
        node_id=command.node_id, reported=Reported(command.id, "succeeded", 0, "exit")
    )
    assert states(first) == ["succeeded"]
    second = job(member, "second", cards=1)
    assert allocate(fleet_id=lab.id)["allocated"] == 0  # exited, not cleaned: still held
    assert CardHold.objects.count() == 8
    # The exit sent the cleanup; the node confirms it.
    cleanup = NodeCommand.objects.get(kind=CommandKind.CLEANUP)
    assert cleanup.payload == {"member": command.id}
    node_command_report(
        node_id=command.node_id,
        reported=Reported(command.id, "succeeded", 0, "exit", cleaned=True),
    )
    assert Member.objects.get(command=command).cleanup == "cleaned"
    assert not CardHold.objects.exists()
    assert allocate(fleet_id=lab.id)["allocated"] == 1
    assert states(second) == ["starting"]


def test_R2_jobs_are_taken_in_admission_order(lab, member):
    jobs = [job(member, f"j{n}", cards=4) for n in range(3)]
    allocate(fleet_id=lab.id)
    assert states(*jobs) == ["starting", "starting", "queued"]


def test_R2_a_job_that_cannot_start_does_not_block_a_smaller_one_behind_it(lab, member):
    stuck = job(member, "stuck", cards=8)
    TrainingJob.objects.filter(pk=stuck.pk).update(cards=9)  # more than the node has now
    behind = job(member, "behind", cards=2)
    allocate(fleet_id=lab.id)
    assert states(stuck, behind) == ["queued", "starting"]


def test_R2_a_job_waiting_past_the_bound_reserves_its_node_against_later_smaller_ones(
    lab, member, settings
):
    settings.TUNEPLANE_ALLOCATION_RESERVE_AFTER = 60
    holder = job(member, "holder", cards=4)
    allocate(fleet_id=lab.id)
    big = job(member, "big", cards=8)  # waits for holder's cards
    small = job(member, "small", cards=2)
    allocate(fleet_id=lab.id)
    assert states(holder, big, small) == ["starting", "queued", "starting"]  # not yet starving
    # big has now waited longer than the bound: nothing smaller overtakes it any more.
    TrainingJob.objects.filter(pk=big.pk).update(created_at=timezone.now() - timedelta(seconds=61))
    smaller = job(member, "smaller", cards=1)
    allocate(fleet_id=lab.id)
    assert states(big, smaller) == ["queued", "queued"]


def test_R3_a_gang_is_allocated_all_or_nothing(node_fleet, gpu_node, member):
    for n in range(2):
        gpu_node(node_fleet, cards=8, address=f"10.0.0.{n + 1}:1")
    too_big = job(member, "three-nodes", cards=8, nodes=2)
    TrainingJob.objects.filter(pk=too_big.pk).update(nodes=3)
    gang = job(member, "gang", cards=8, nodes=2)
    allocate(fleet_id=node_fleet.id)
    assert states(too_big, gang) == ["queued", "starting"]
    assert not Attempt.objects.filter(training_job=too_big).exists()
    members = list(Member.objects.filter(attempt__training_job=gang).order_by("rank"))
    assert len({m.node_id for m in members}) == 2
    rendezvous = [NodeCommand.objects.get(pk=m.command_id).payload["rendezvous"] for m in members]
    assert [r["RANK"] for r in rendezvous] == [0, 1]
    assert {r["MASTER_ADDR"] for r in rendezvous} == {members[0].node.address.split(":")[0]}
    assert {r["WORLD_SIZE"] for r in rendezvous} == {16}
    # R16: the rendezvous port is rank 0's, held in its node's port ledger while it runs.
    assert {r["MASTER_PORT"] for r in rendezvous} == {members[0].port} and members[0].port
    assert members[1].port is None


def test_R1_an_allocation_pass_takes_a_fixed_number_of_queries(node_fleet, gpu_node, member):
    def queries(nodes: int, jobs: int) -> int:
        for n in range(nodes):
            gpu_node(node_fleet, address=f"10.1.{nodes}.{n}:1")
        for n in range(jobs):
            job(member, f"q{nodes}-{n}", cards=1)
        with CaptureQueriesContext(connection) as captured:
            assert allocate(fleet_id=node_fleet.id)["allocated"] == jobs
        return len(captured)

    assert queries(1, 1) == queries(4, 6)


def test_R16_every_member_is_bounded_by_its_share_or_its_fleets_default(
    node_fleet, gpu_node, member
):
    """A job naming no CPUs or memory gets its cards' share of its node's budgets, written
    on its member (what the allocator subtracts next pass) and sent to the agent, which
    confines it to that; a Fleet's config default comes before the share."""
    gpu_node(node_fleet, cpu_budget=32, memory_budget_bytes=256 * 2**30)
    shared = job(member, name="shared", cards=2)
    allocate(fleet_id=node_fleet.id)
    [placed] = Member.objects.filter(attempt__training_job=shared)
    assert (placed.cpus, placed.memory_bytes) == (8.0, 64 * 2**30)
    payload = NodeCommand.objects.get(pk=placed.command_id).payload
    assert (payload["cpus"], payload["memory_bytes"]) == (8.0, 64 * 2**30)
    node_fleet.config = {"member_cpus": 2, "member_memory_bytes": 4 * 2**30}
    node_fleet.save(update_fields=["config"])
    defaulted = job(member, name="defaulted", cards=2)
    allocate(fleet_id=node_fleet.id)
    [placed] = Member.objects.filter(attempt__training_job=defaulted)
    assert (placed.cpus, placed.memory_bytes) == (2, 4 * 2**30)


def test_R14_a_fleet_that_pulls_always_says_so_in_every_start(node_fleet, gpu_node, member):
    gpu_node(node_fleet, container_runtime="docker 28.2.2")
    node_fleet.config = {"image_pull": "always"}
    node_fleet.save(update_fields=["config"])
    pulled = job(member, name="pulled", image="registry.example/ml/train:1")
    allocate(fleet_id=node_fleet.id)
    [placed] = Member.objects.filter(attempt__training_job=pulled)
    assert NodeCommand.objects.get(pk=placed.command_id).payload["pull"] == "always"
