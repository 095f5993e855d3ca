"""A workload naming an ``image`` runs only on nodes with a container runtime (DESIGN §7,
R1, P6, P7): the allocator never offers it another node, and admission refuses it, with that
reason, where no placeable node has one. A member in a container on a real agent is
tests/e2e/test_container_jobs.py."""

import pytest

from audit.models import AuditEvent
from nodes.models import Node, NodeCommand
from placement.models import Deployment, Episode, Member, TrainingJob
from placement.services.allocator import allocate

IMAGE = "registry.example:5000/ml/train:2.1"


@pytest.fixture
def runtime_node(gpu_node):
    """A placeable node (L1) with or without a container runtime in its inventory."""

    def make(fleet, address: str, runtime: str | None, cards: int = 2) -> Node:
        return gpu_node(fleet, cards=cards, address=address, container_runtime=runtime)

    return make


@pytest.fixture
def lab(make_fleet):
    return make_fleet("gpu-lab", kind="node", capabilities=["train", "serve", "env"])


def submit(api, path, **body):
    return api.post(f"/api/{path}", {"project": "ml", "name": "w", "cards": 1, **body})


def node_of(job_id: int) -> str:
    return Member.objects.get(attempt__training_job_id=job_id).node_id


def test_R1_the_allocator_offers_a_workload_naming_an_image_only_nodes_with_a_runtime(
    lab, runtime_node, member_api
):
    bare = runtime_node(lab, "10.0.0.1:1", None)
    blank = runtime_node(lab, "10.0.0.2:1", "  ")  # a report saying nothing is no runtime
    # The bare nodes have room for everything; the node with docker only for one job.
    docker = runtime_node(lab, "10.0.0.3:1", "docker 20.10.24", cards=1)
    first = submit(member_api, "training-jobs", image=IMAGE).json()
    second = submit(member_api, "training-jobs", image=IMAGE, command=["python", "t.py"]).json()
    plain = submit(member_api, "training-jobs", command=["python", "t.py"]).json()
    allocate(fleet_id=lab.id)
    assert node_of(first["id"]) == docker.id
    assert TrainingJob.objects.get(pk=second["id"]).state == "queued"  # waits for docker
    assert node_of(plain["id"]) in {bare.id, blank.id}  # nothing keeps a plain job off them
    started = NodeCommand.objects.get(member__attempt__training_job_id=first["id"]).payload
    assert started["image"] == IMAGE and "argv" not in started  # the image's default command


def test_R1_replicas_and_episodes_naming_an_image_are_placed_only_with_a_runtime(
    lab, runtime_node, member_api
):
    runtime_node(lab, "10.0.0.1:1", None)
    deployment = submit(
        member_api, "deployments", fleet=lab.id, port=8200, command=["serve"]
    ).json()
    allocate(fleet_id=lab.id)
    assert Member.objects.filter(revision__number=1).count() == 1
    # A new revision and an episode pass admission's gates again (issue 37): an image where
    # no node has a runtime is refused as admission refuses it ...
    revision = {"image": IMAGE, "command": [], "port": 8201}
    revisions = f"/api/deployments/{deployment['id']}/revisions"
    environment = member_api.post(
        "/api/environments", {"project": "ml", "name": "e", "manifest": {"fleet": lab.id}}
    ).json()
    episodes = f"/api/environments/{environment['id']}/episodes"
    tried = [member_api.post(revisions, revision), member_api.post(episodes, {"image": IMAGE})]
    for refused in tried:
        assert refused.status_code == 422, refused.content
        assert refused.json()["error"]["reason"] == "inventory_fit"
    # ... and once one has, the allocator alone keeps the image off the node without one.
    docker = runtime_node(lab, "10.0.0.2:1", "podman 4.9.3")
    assert member_api.post(revisions, revision).status_code == 201
    number = member_api.post(episodes, {"image": IMAGE}).json()["number"]
    episode = Episode.objects.get(environment_id=environment["id"], number=number)
    allocate(fleet_id=lab.id)
    placed = Member.objects.filter(revision__number=2) | Member.objects.filter(episode=episode)
    assert {m.node_id for m in placed} == {docker.id} and placed.count() == 2
    assert episode.image == IMAGE


@pytest.mark.parametrize(
    "path, body",
    [
        ("training-jobs", {"image": IMAGE}),
        ("lifecycle-jobs", {"image": IMAGE, "kind": "eval", "command": ["true"]}),
        ("deployments", {"image": IMAGE, "port": 8200}),
        ("playground-sessions", {"image": IMAGE, "port": 8200}),
    ],
)
def test_P7_admission_refuses_an_image_where_no_node_has_a_container_runtime(
    make_fleet, runtime_node, member_api, path, body
):
    fleet = make_fleet("gpu-lab", kind="node", capabilities=["train", "eval", "serve"])
    runtime_node(fleet, "10.0.0.1:1", None)
    events = AuditEvent.objects.count()
    refused = submit(member_api, path, **body)
    assert refused.status_code == 422, refused.content
    error = refused.json()["error"]
    assert (error["code"], error["reason"]) == ("placement_refused", "inventory_fit"), error
    assert "no node with a container runtime" in error["message"]
    assert AuditEvent.objects.count() == events  # nothing written
    # Without the image the same workload fits; with a runtime on the node, so does the image.
    plain = {key: value for key, value in body.items() if key != "image"}
    plain.setdefault("command", ["true"])
    assert submit(member_api, path, **plain).status_code == 201
    runtime_node(fleet, "10.0.0.2:1", "docker 20.10.24")
    admitted = submit(member_api, path, **body)
    assert admitted.status_code == 201, admitted.content
    if path == "deployments":
        assert Deployment.objects.get(pk=admitted.json()["id"]).revisions.get().image == IMAGE
    else:
        assert admitted.json()["image"] == IMAGE
