"""Issue 17, item 1 (F8): a project Fleet takes only workloads of its own project, whoever
submits them — a member of two projects, or staff. For any other project it is not found,
exactly as a Fleet that does not exist, and automatic placement never lands there."""

import json

import pytest
from django.contrib.auth import get_user_model

from nodes.services.control import node_report_inventory
from nodes.services.join import node_join
from nodes.services.sessions import session_open
from placement.models import Deployment, Environment, LifecycleJob, PlaygroundSession, TrainingJob
from tests.conftest import H100_DEVICE_INVENTORY, SERVE, Api, make_csr
from tuneplane.models import Membership, Project

EVERY_KIND = ["train", "eval", "serve", "env"]

# Each workload kind, as submitted with the Fleet named where the kind names one.
AUTOMATIC = {
    "training-jobs": ({"series": "h100", "cards": 1, "command": ["true"]}, TrainingJob),
    "lifecycle-jobs": (
        {"kind": "eval", "series": "h100", "cards": 1, "command": ["true"]},
        LifecycleJob,
    ),
    "playground-sessions": ({"cards": 1, **SERVE}, PlaygroundSession),
}
NAMED = {
    "deployments": (lambda fleet_id: {"fleet": fleet_id, "cards": 1, **SERVE}, Deployment),
    "environments": (lambda fleet_id: {"manifest": {"fleet": fleet_id}}, Environment),
}


@pytest.fixture
def other_project(db):
    return Project.objects.create(slug="p2", name="Other project")


@pytest.fixture
def in_both(project, other_project):
    user = get_user_model().objects.create_user("bo", password="bo-password-1")
    Membership.objects.create(project=project, user=user)
    Membership.objects.create(project=other_project, user=user)
    return user


@pytest.fixture
def ml_lab(make_fleet, mint, project):
    """Project ml's own Fleet of one placeable 8 × H100 node, with every capability."""
    fleet = make_fleet("ml-lab", capabilities=EVERY_KIND, visibility="project", project=project)
    joined = node_join(
        token=mint(fleet)[1], fleet_id=fleet.id, csr=make_csr()[1], inventory=H100_DEVICE_INVENTORY
    )
    session_open(node_id=joined.node.id, serial=joined.certificate.serial, gateway="test")
    node_report_inventory(node_id=joined.node.id, inventory=H100_DEVICE_INVENTORY)
    return fleet


@pytest.fixture(params=["member of both", "staff"])
def submitter(request, in_both, admin_user):
    return Api(in_both if request.param == "member of both" else admin_user)


def post(api, path, project, body):
    return api.post(f"/api/{path}", {"project": project, "name": "w", **body})


def strip(response, *ids):
    text = response.content.decode()
    for fleet_id in ids:
        text = text.replace(fleet_id, "<id>")
    return response.status_code, json.loads(text)


@pytest.mark.parametrize("path", list(NAMED))
def test_issue17_item1_a_project_fleet_named_for_another_projects_workload_is_not_found(
    ml_lab, submitter, path
):
    body, model = NAMED[path]
    named = post(submitter, path, "p2", body("ml-lab"))
    missing = post(submitter, path, "p2", body("zz-lab"))  # the same length and shape
    assert named.status_code == 404, named.content
    assert strip(named, "ml-lab") == strip(missing, "zz-lab")
    assert not model.objects.exists()
    assert post(submitter, path, "ml", body("ml-lab")).status_code == 201


@pytest.mark.parametrize("path", list(AUTOMATIC))
def test_issue17_item1_automatic_placement_never_puts_another_projects_workload_on_a_project_fleet(
    ml_lab, submitter, path
):
    body, model = AUTOMATIC[path]
    refused = post(submitter, path, "p2", body)
    assert refused.status_code == 422, refused.content
    assert "ml-lab" not in refused.content.decode()
    assert not model.objects.exists()
    placed = post(submitter, path, "ml", body)
    assert placed.status_code == 201 and placed.json()["fleet"] == "ml-lab"


def test_issue17_item1_members_of_the_other_project_never_see_the_fleet_in_its_records(
    ml_lab, in_both, other_project, admin_user
):
    """What did leak: a p2 record naming ml-lab and a node, read by a member of p2 only."""
    p2_only = get_user_model().objects.create_user("pia", password="pia-password-1")
    Membership.objects.create(project=other_project, user=p2_only)
    for api in (Api(in_both), Api(admin_user)):
        for path, (body, _) in AUTOMATIC.items():
            post(api, path, "p2", body)
        for path, (body, _) in NAMED.items():
            post(api, path, "p2", body("ml-lab"))
    reader = Api(p2_only)
    for path in [*AUTOMATIC, *NAMED]:
        listed = reader.get(f"/api/{path}")
        assert listed.status_code == 200 and "ml-lab" not in listed.content.decode()


def test_issue17_item3_a_member_learns_how_many_nodes_fitted_never_which(
    ml_lab, member_api, admin_api
):
    node_id = ml_lab.nodes.get().id
    placed = post(member_api, "training-jobs", "ml", AUTOMATIC["training-jobs"][0])
    assert placed.status_code == 201 and node_id not in placed.content.decode()
    assert placed.json()["admission"]["fits_on_nodes"] == 1
    assert node_id not in member_api.get("/api/training-jobs").content.decode()
    admin_view = admin_api.get("/api/training-jobs").json()["results"][0]["admission"]
    assert admin_view["fits_on"] == [node_id] and admin_view["fits_on_nodes"] == 1
