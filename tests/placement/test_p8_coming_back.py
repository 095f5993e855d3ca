"""P8: admission's fit counts every node that is coming back — cordoned, quiet or gone — and
none that is leaving — draining, drained or removed (issue 49). Work that only a cordoned
machine fits is admitted and queues, waiting ``cordoned`` with the cordon's words (Q8), the
first thing a newcomer meets on a default (shared-mount) Fleet whose machine cannot see the
storage root (L6); it is placed once the cordon is lifted, and never before (L1, D1). Work
that only a leaving machine fits is refused, naming it and its drain (P6), until it is
resumed. Only nodes of Fleets the project can see are ever named (F8)."""

import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from nodes.choices import CordonSource, SchedulingState
from nodes.models import Node, NodeCordon
from nodes.services.cordons import node_cordon, node_uncordon
from nodes.services.drains import node_drain, node_resume
from placement.models import TrainingJob
from placement.services.allocator import allocate
from tests.conftest import SERVE, SYSTEM, placeable_node

EXAMPLE_INVENTORY = json.loads(
    (Path(__file__).resolve().parents[2] / "examples" / "inventory.json").read_text()
)
JOB = {"project": "ml", "name": "train", "cards": 2, "command": ["true"]}


def admitted(member_api, body=JOB, path="/api/training-jobs") -> dict:
    response = member_api.post(path, body)
    assert response.status_code == 201, response.content
    return response.json()


def refused(member_api, body=JOB, path="/api/training-jobs") -> str:
    response = member_api.post(path, body)
    assert response.status_code == 422, response.content
    error = response.json()["error"]
    assert (error["code"], error["reason"]) == ("placement_refused", "inventory_fit")
    return error["message"]


def waiting_of(job_id: int) -> dict:
    job = TrainingJob.objects.get(pk=job_id)
    allocate(fleet_id=job.fleet_id)
    job.refresh_from_db()
    assert job.state == "queued", job.state
    return job.waiting


@pytest.fixture
def shared_mount_node(make_fleet, mint):
    """A node of a default node Fleet (shared-mount) that cannot see its storage root."""
    fleet = make_fleet("gpu-lab", capabilities=["train", "serve"])
    assert fleet.delivery == "shared-mount"
    node = placeable_node(mint, fleet, EXAMPLE_INVENTORY, "10.0.0.1:1")
    assert NodeCordon.objects.get(node=node).source == CordonSource.STORAGE
    return node


@pytest.fixture
def lab(make_fleet, mint):
    """An object-pull Fleet (no storage root to lose) with one placeable node of 2 cards."""
    fleet = make_fleet("gpu-lab", delivery="object-pull", capabilities=["train", "serve"])
    return placeable_node(mint, fleet, EXAMPLE_INVENTORY, "10.0.0.1:1")


def test_P8_work_only_a_cordoned_machine_fits_queues_waiting_cordoned_with_its_words(
    lab, member_api
):
    node_cordon(actor=SYSTEM, node=lab, reason="kernel upgrade")
    job = admitted(member_api)
    assert job["fleet"] == "gpu-lab"
    wait = waiting_of(job["id"])
    assert wait["reason"] == "cordoned"
    assert (
        wait["message"]
        == "needs 2 cards; 0 free, 2 more on cordoned nodes (operator: kernel upgrade)"
    )
    assert wait["numbers"] == {
        "needs": 2,
        "free": 0,
        "cordoned": 2,
        "cordons": ["operator: kernel upgrade"],
    }
    assert TrainingJob.objects.get(pk=job["id"]).state == "queued"  # D1: never placed there
    node_uncordon(actor=SYSTEM, node=lab)
    allocate(fleet_id="gpu-lab")
    assert TrainingJob.objects.get(pk=job["id"]).state == "starting"


def test_P8_L6_a_storage_cordon_is_waited_for_and_named_on_every_path(
    shared_mount_node, member_api
):
    job = admitted(member_api)
    wait = waiting_of(job["id"])
    assert wait["reason"] == "cordoned"
    assert wait["message"].endswith(
        "2 more on cordoned nodes (storage: storage root not visible); a storage cordon lifts "
        "by itself when its node sees the Fleet's storage root again (rule L6)"
    )
    # A deployment names its Fleet (P2): admitted the same way.
    deployment = {"project": "ml", "name": "chat", "fleet": "gpu-lab", "cards": 2, **SERVE}
    assert admitted(member_api, deployment, path="/api/deployments")["fleet"] == "gpu-lab"


def test_P8_every_cordon_of_the_node_is_quoted_once(
    shared_mount_node, make_fleet, mint, member_api
):
    node_cordon(actor=SYSTEM, node=shared_mount_node, reason="RMA ticket 42")
    job = admitted(member_api)
    wait = waiting_of(job["id"])
    assert wait["numbers"]["cordons"] == [
        "storage: storage root not visible",
        "operator: RMA ticket 42",
    ]


@pytest.mark.parametrize("how", ["no_lease", "stale_inventory", "gone", "enrolled"])
def test_P8_a_quiet_or_gone_machine_is_coming_back_and_its_work_waits_for_it(lab, member_api, how):
    changes = {
        "no_lease": {"lease_expires_at": timezone.now() - timedelta(seconds=1)},
        "stale_inventory": {"inventory_observed_at": timezone.now() - timedelta(minutes=5)},
        "gone": {"scheduling_state": SchedulingState.GONE},
        "enrolled": {"scheduling_state": SchedulingState.ENROLLED},
    }[how]
    Node.objects.filter(pk=lab.pk).update(**changes)
    job = admitted(member_api)
    wait = waiting_of(job["id"])
    assert (wait["reason"], wait["numbers"]["node_unreachable"]) == ("node_unreachable", 2)


@pytest.mark.parametrize("busy", [False, True], ids=["drained", "draining"])
def test_P8_a_leaving_machine_counts_for_nothing_and_the_refusal_names_it(lab, member_api, busy):
    if busy:
        Node.objects.filter(pk=lab.pk).update(scheduling_state=SchedulingState.DRAINING)
        Node.objects.filter(pk=lab.pk).update(
            drain_reason="rack 4 power work", drain_started_at=timezone.now()
        )
    else:
        node_drain(actor=SYSTEM, node=lab, reason="rack 4 power work")
    state = "draining" if busy else "drained"
    message = refused(member_api)
    assert message.startswith("No Fleet you can see fits 2 × any card on one node, counting")
    assert (
        f" 1 node that would fit is leaving: {lab.id} ({state}: rack 4 power work). A draining "
        "or drained machine takes no new work until an administrator resumes it (rules D1, P8)."
    ) in message
    # A deployment names its Fleet (P2): the same words on that path.
    deployment = {"project": "ml", "name": "chat", "fleet": "gpu-lab", "cards": 2, **SERVE}
    named = refused(member_api, deployment, path="/api/deployments")
    assert named.startswith("Fleet 'gpu-lab' has no nodes for 2 × any card")
    assert f"leaving: {lab.id}" in named
    if not busy:
        node_resume(actor=SYSTEM, node=lab)
        assert admitted(member_api)["fleet"] == "gpu-lab"


def test_P8_a_gone_machine_whose_drain_was_never_undone_is_still_leaving(lab, member_api):
    node_drain(actor=SYSTEM, node=lab, reason="decommission")
    Node.objects.filter(pk=lab.pk).update(scheduling_state=SchedulingState.GONE)
    assert f"leaving: {lab.id} (gone: decommission)" in refused(member_api)


def test_P8_a_leaving_node_too_small_or_short_of_a_gang_is_not_named(lab, member_api):
    node_drain(actor=SYSTEM, node=lab, reason="leaving")
    assert "is leaving" not in refused(member_api, {**JOB, "cards": 4})
    # Two nodes asked, one node in the Fleet: resuming it would not fit the gang.
    assert "is leaving" not in refused(member_api, {**JOB, "nodes": 2})


def test_P8_a_fleet_that_fits_now_is_chosen_before_one_that_fits_only_with_a_cordoned_node(
    make_fleet, mint, member_api
):
    big = make_fleet("a-big", delivery="object-pull", capabilities=["train"])
    for n in range(1, 3):  # the most fitting cards, but all behind cordons
        node = placeable_node(mint, big, EXAMPLE_INVENTORY, f"10.0.1.{n}:1")
        node_cordon(actor=SYSTEM, node=node, reason="firmware")
    small = make_fleet("b-small", delivery="object-pull", capabilities=["train"])
    placeable_node(mint, small, EXAMPLE_INVENTORY, "10.0.2.1:1")
    assert admitted(member_api)["fleet"] == "b-small"
    NodeCordon.objects.all().delete()
    assert admitted(member_api, {**JOB, "name": "again"})["fleet"] == "a-big"


def test_F8_a_leaving_node_of_a_fleet_the_project_cannot_see_is_never_named(
    make_fleet, mint, member_api, vision
):
    from tuneplane.models import Project

    hidden = make_fleet(
        "cv-lab",
        delivery="object-pull",
        capabilities=["train"],
        visibility="project",
        project=Project.objects.get(slug="cv"),
    )
    node = placeable_node(mint, hidden, EXAMPLE_INVENTORY, "10.0.0.9:1")
    node_drain(actor=SYSTEM, node=node, reason="secret reason")
    make_fleet("ml-lab", delivery="object-pull", capabilities=["train"])
    message = refused(member_api)
    assert "is leaving" not in message and node.id not in message and "cv-lab" not in message
    assert "secret reason" not in message
