"""Q9: admission and the allocator count the same thing, the devices a node reports (each card
by index and UUID), never a card count the allocator cannot hold. A node whose inventory
counts cards but lists no devices never counts toward fit; a refusal it caused says so and
names the fix.

As a user met it (issue 38): an agent whose --inventory-file lists `cards` without `devices`
was admitted work (`fits_on_nodes: 1`) that the allocator never placed."""

import pytest

from audit.services import Actor
from placement.admission import Need, admit_named
from placement.models import Member, TrainingJob
from placement.services import submission
from placement.services.allocator import allocate
from tests.conftest import H100_INVENTORY, SERVE, placeable_node
from tuneplane.errors import PlacementRefused

FIX = "the agent's inventory must list each card's index and uuid"


@pytest.fixture
def cards_only(mint):
    """A placeable node (L1) whose inventory counts its cards but lists no devices, as an
    --inventory-file with `cards` alone makes it."""

    def make(fleet, address="10.0.0.9:1", inventory=H100_INVENTORY):
        return placeable_node(mint, fleet, inventory, address)

    return make


def submit(api, path="training-jobs", **body):
    runs = SERVE if path == "deployments" else {"command": ["true"]}
    return api.post(f"/api/{path}", {"project": "ml", "name": "w", **runs, **body})


def inventory_fit_refusal(response) -> str:
    assert response.status_code == 422, response.content
    error = response.json()["error"]
    assert error["reason"] == "inventory_fit", error
    return error["message"]


def test_Q9_a_node_listing_cards_without_devices_never_counts_toward_fit(
    make_fleet, cards_only, project
):
    fleet = make_fleet("gpu-lab", capabilities=["train"])
    cards_only(fleet)  # 8 × H100 counted, no devices
    for need in (Need("train", "", 1), Need("train", "h100", 8)):
        with pytest.raises(PlacementRefused) as refused:
            admit_named(project, "gpu-lab", need)
        assert refused.value.reason == "inventory_fit"


def test_Q9_a_refusal_caused_by_cards_without_devices_says_so_and_names_the_fix(
    make_fleet, cards_only, member_api, project
):
    fleet = make_fleet("gpu-lab", capabilities=["train", "serve"])
    node = cards_only(fleet)
    message = inventory_fit_refusal(submit(member_api, cards=1))  # chosen automatically
    assert "A node of gpu-lab reports 8 cards but no devices" in message
    assert FIX in message and "rule Q9" in message
    named = inventory_fit_refusal(
        submit(member_api, "deployments", fleet="gpu-lab", series="h100", cards=8)
    )
    assert "reports 8 h100 but no devices" in named and FIX in named
    # Which node is an administrator's to read (issue 17 item 3); the join warned the node.
    assert node.id not in message and node.id not in named


def test_Q9_what_admission_admits_the_allocator_places(
    make_fleet, cards_only, gpu_node, member_api, admin_api, project
):
    """The user's story end to end: refused while the only node lists no devices; admitted
    onto the node that lists them once there is one, and placed there."""
    fleet = make_fleet("gpu-lab", capabilities=["train"])
    blind = cards_only(fleet)
    inventory_fit_refusal(submit(member_api, cards=8))
    listed = gpu_node(fleet, cards=8, address="10.0.0.1:1")
    placed = submit(member_api, cards=8)
    assert placed.status_code == 201, placed.content
    assert placed.json()["admission"]["fits_on_nodes"] == 1
    shown = admin_api.get("/api/training-jobs").json()["results"][0]["admission"]
    assert shown["fits_on"] == [listed.id] and blind.id not in str(shown)
    assert allocate(fleet_id=fleet.id) == {"allocated": 1, "waiting": 0, "preempted": 0}
    job = TrainingJob.objects.get()
    assert job.state == "starting"
    assert list(Member.objects.values_list("node_id", flat=True)) == [listed.id]


def test_Q9_a_gang_counts_only_the_nodes_that_list_devices(
    make_fleet, cards_only, gpu_node, member_api, project
):
    fleet = make_fleet("gpu-lab", capabilities=["train"])
    gpu_node(fleet, cards=8, address="10.0.0.1:1")
    cards_only(fleet, address="10.0.0.2:1")
    message = inventory_fit_refusal(submit(member_api, series="h100", cards=8, nodes=2))
    assert "A node of gpu-lab reports 8 h100 but no devices" in message
    assert FIX in message
    assert submit(member_api, series="h100", cards=8, nodes=1).status_code == 201


def test_Q9_automatic_choice_never_picks_a_fleet_for_cards_it_lists_no_devices_for(
    make_fleet, cards_only, gpu_node, member, project
):
    """Automatic placement takes the Fleet with the most fitting cards (P1): counted by
    devices, the 16 cards a node lists no devices for are none."""
    sixteen = {**H100_INVENTORY, "cards": [{"name": "NVIDIA H100 80GB HBM3", "count": 16}]}
    cards_only(make_fleet("a-big", capabilities=["train"]), inventory=sixteen)
    listed = gpu_node(make_fleet("b-lab", capabilities=["train"]), cards=8)
    job = submission.training_job_submit(
        actor=Actor.of_user(member), project="ml", name="w", command=["true"], cards=8
    )
    assert job.fleet_id == "b-lab" and job.admission["fits_on"] == [listed.id]
    assert allocate(fleet_id="b-lab") == {"allocated": 1, "waiting": 0, "preempted": 0}
