"""Admission's gates run again each time work is added to what was admitted: an episode of an
environment, a new revision of a deployment, a resolve (issue 37). After an administrator
makes the Fleet private to another project, the member gets the same byte-identical 404 a
new submission gets (F8); after the Fleet stops promising the capability, the same 422 (F3);
an episode asking more cards than any node has is refused (P7), never queued for ever."""

import pytest

from audit.services import Actor
from fleets.services import fleet_update
from placement.services import submission
from tests.conftest import SERVE, SYSTEM
from tuneplane.models import Project


@pytest.fixture
def lab(make_fleet, gpu_node):
    fleet = make_fleet("gpu-lab", kind="node", capabilities=["train", "serve", "env"])
    gpu_node(fleet)
    return fleet


@pytest.fixture
def admitted(lab, member):
    actor = Actor.of_user(member)
    environment = submission.environment_submit(
        actor=actor, project="ml", name="env", manifest={"fleet": "gpu-lab"}
    )
    deployment = submission.deployment_submit(
        actor=actor, project="ml", name="chat", **{**SERVE, "fleet": "gpu-lab"}
    )
    return environment, deployment


def add_work(api, environment, deployment) -> list:
    return [
        api.post(f"/api/environments/{environment.pk}/episodes", {"command": ["true"]}),
        api.post(f"/api/deployments/{deployment.pk}/revisions", {"port": 8001}),
        api.post(f"/api/environments/{environment.pk}/resolve"),
    ]


def test_F8_a_fleet_made_private_to_another_project_is_the_same_404_for_added_work(
    lab, admitted, member_api
):
    named = {**SERVE, "project": "ml", "fleet": "gpu-lab", "port": 9000}
    opened = member_api.post("/api/deployments", {**named, "name": "j"})
    assert opened.status_code == 201, opened.content  # open to ml now
    other = Project.objects.create(slug="other", name="Other")
    fleet_update(actor=SYSTEM, fleet=lab, visibility="project", project=other)
    refused = member_api.post("/api/deployments", {**named, "name": "k"})
    assert refused.status_code == 404
    for response in add_work(member_api, *admitted):
        assert response.status_code == 404, response.content
        assert response.content == refused.content  # byte for byte what admission says


@pytest.mark.parametrize("dropped", ["env", "serve"])
def test_F3_a_fleet_that_no_longer_promises_the_capability_refuses_added_work(
    lab, admitted, member_api, dropped
):
    kept = [c for c in ("train", "serve", "env") if c != dropped]
    fleet_update(actor=SYSTEM, fleet=lab, capabilities=kept)
    episode, revision, resolve = add_work(member_api, *admitted)
    refused = [episode, resolve] if dropped == "env" else [revision]
    for response in refused:
        assert response.status_code == 422, response.content
        assert response.json()["error"]["reason"] == "capability"
    allowed = [revision] if dropped == "env" else [episode]
    assert [r.status_code for r in allowed] == [201]


def test_P7_an_episode_asking_more_cards_than_any_node_has_is_refused_not_queued(
    lab, admitted, member_api
):
    environment, _ = admitted
    response = member_api.post(
        f"/api/environments/{environment.pk}/episodes", {"command": ["true"], "cards": 64}
    )
    assert response.status_code == 422, response.content
    assert response.json()["error"]["reason"] == "inventory_fit"
    assert not environment.episodes.exists()
