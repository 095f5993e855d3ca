"""P6: a refusal says why, and when nodes that would fit are cordoned, it names them and
their cordons (D1), a storage cordon with how it lifts (L6) — the first thing a newcomer meets
on a default (shared-mount) Fleet with a machine that cannot see the storage root. Only nodes
of Fleets the project can see are ever named (F8)."""

import json
from pathlib import Path

import pytest

from nodes.choices import CordonSource
from nodes.models import NodeCordon
from nodes.services.cordons import node_cordon
from tests.conftest import SERVE, SYSTEM, placeable_node

EXAMPLE_INVENTORY = json.loads(
    (Path(__file__).resolve().parents[2] / "examples" / "inventory.json").read_text()
)
JOB = {"project": "ml", "name": "train", "cards": 2, "command": ["true"]}


def refused(member_api, body=JOB, path="/api/training-jobs") -> str:
    response = member_api.post(path, body)
    assert response.status_code == 422, response.content
    error = response.json()["error"]
    assert (error["code"], error["reason"]) == ("placement_refused", "inventory_fit")
    return error["message"]


@pytest.fixture
def shared_mount_node(make_fleet, mint):
    """A node of a default node Fleet (shared-mount) that cannot see its storage root."""
    fleet = make_fleet("gpu-lab", capabilities=["train", "serve"])
    assert fleet.delivery == "shared-mount"
    node = placeable_node(mint, fleet, EXAMPLE_INVENTORY, "10.0.0.1:1")
    assert NodeCordon.objects.get(node=node).source == CordonSource.STORAGE
    return node


def test_P6_L6_a_refusal_names_the_storage_cordon_of_a_node_that_would_fit(
    shared_mount_node, member_api
):
    message = refused(member_api)
    assert message.startswith("No Fleet you can see fits 2 × any card on one node now;")
    assert (
        f" 1 node that would fit is cordoned: {shared_mount_node.id} "
        "(storage: storage root not visible). A cordoned node takes no new work (rule D1). "
        "A storage cordon lifts by itself when the node sees its Fleet's storage root again "
        "(rule L6)."
    ) in message
    # A deployment names its Fleet (P2): the same words on that path.
    deployment = {"project": "ml", "name": "chat", "fleet": "gpu-lab", "cards": 2, **SERVE}
    named = refused(member_api, deployment, path="/api/deployments")
    assert named.startswith("Fleet 'gpu-lab' has no placeable nodes for 2 × any card")
    assert f"cordoned: {shared_mount_node.id} (storage: storage root not visible)" in named


def test_P6_D1_a_refusal_names_every_cordon_of_the_node(shared_mount_node, member_api):
    node_cordon(actor=SYSTEM, node=shared_mount_node, reason="RMA ticket 42")
    message = refused(member_api)
    assert (
        f"cordoned: {shared_mount_node.id} (storage: storage root not visible; "
        "operator: RMA ticket 42)."
    ) in message


def test_P6_D1_an_operator_cordon_alone_says_no_storage_rule(make_fleet, mint, member_api):
    fleet = make_fleet("gpu-lab", delivery="object-pull", capabilities=["train"])
    nodes = [placeable_node(mint, fleet, EXAMPLE_INVENTORY, f"10.0.0.{n}:1") for n in range(1, 3)]
    for node in nodes:
        node_cordon(actor=SYSTEM, node=node, reason="kernel upgrade")
    message = refused(member_api)
    first, second = sorted(node.id for node in nodes)
    assert (
        f" 2 nodes that would fit are cordoned: {first} (operator: kernel upgrade), "
        f"{second} (operator: kernel upgrade). A cordoned node takes no new work (rule D1)."
    ) in message
    assert "L6" not in message


def test_P6_a_cordoned_node_too_small_for_the_request_is_not_named(shared_mount_node, member_api):
    message = refused(member_api, {**JOB, "cards": 4})
    assert "cordoned" not in message and shared_mount_node.id not in message


def test_P6_a_gang_is_told_of_cordons_only_where_they_would_make_it_fit(
    shared_mount_node, member_api
):
    """Two nodes asked, one node in the Fleet: lifting its cordon would not fit the gang."""
    assert "cordoned" not in refused(member_api, {**JOB, "nodes": 2})


def test_F8_a_cordoned_node_of_a_fleet_the_project_cannot_see_is_never_named(
    make_fleet, mint, member_api, vision
):
    from tuneplane.models import Project

    hidden = make_fleet(
        "cv-lab",
        capabilities=["train"],
        visibility="project",
        project=Project.objects.get(slug="cv"),
    )
    node = placeable_node(mint, hidden, EXAMPLE_INVENTORY, "10.0.0.9:1")
    assert NodeCordon.objects.filter(node=node).exists()
    make_fleet("ml-lab", delivery="object-pull", capabilities=["train"])
    message = refused(member_api)
    assert "cordoned" not in message and node.id not in message and "cv-lab" not in message
