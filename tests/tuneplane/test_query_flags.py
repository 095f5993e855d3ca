"""Q7: a dry run writes nothing — however its user spells yes. Every boolean query parameter
(``dry_run``, a node's ``force``, card names' ``mapped``) is read one way, by
tuneplane.api.query.query_flag, with DRF's BooleanField values; anything else is a 400 naming
the parameter. ``?dry_run=True`` was read as false and wrote the submission its user meant as
a dry run (issue 47)."""

import pytest

from nodes.choices import SchedulingState
from nodes.models import CardAlias, Node
from placement.models import TrainingJob
from tests.conftest import SERVE

JOB = {"project": "ml", "name": "train", "cards": 1, "command": ["true"]}


@pytest.fixture
def lab(node_fleet, gpu_node):
    gpu_node(node_fleet)
    return node_fleet


@pytest.mark.parametrize("spelled", ["1", "True", "true", "yes", "on", "TRUE", "y"])
def test_Q7_a_dry_run_spelled_any_true_way_writes_nothing(lab, member_api, spelled):
    response = member_api.post(f"/api/training-jobs?dry_run={spelled}", JOB)
    assert response.status_code == 200, response.content
    assert (response.json()["dry_run"], response.json()["id"]) == (True, None)
    assert not TrainingJob.objects.exists()


@pytest.mark.parametrize("spelled", ["0", "false", "False", "no", "off"])
def test_Q7_dry_run_spelled_false_submits(lab, member_api, spelled):
    response = member_api.post(f"/api/training-jobs?dry_run={spelled}", JOB)
    assert response.status_code == 201, response.content
    assert TrainingJob.objects.count() == 1


@pytest.mark.parametrize("spelled", ["maybe", "", "2", "tru", "yes please"])
def test_Q7_a_dry_run_that_is_no_boolean_is_a_400_naming_it_and_writes_nothing(
    lab, member_api, spelled
):
    response = member_api.post(f"/api/training-jobs?dry_run={spelled}", JOB)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == "dry_run" and "dry_run" in error["message"]
    assert not TrainingJob.objects.exists()


def test_Q7_every_workload_kind_reads_dry_run_the_same_way(lab, member_api):
    served = {"project": "ml", "name": "chat", "fleet": "gpu-lab", "cards": 1, **SERVE}
    for path, body in (("training-jobs", JOB), ("deployments", served)):
        answered = member_api.post(f"/api/{path}?dry_run=True", body)
        assert answered.status_code == 200 and answered.json()["dry_run"] is True, path
        refused = member_api.post(f"/api/{path}?dry_run=maybe", body)
        assert refused.status_code == 400 and refused.json()["error"]["field"] == "dry_run"


def test_D3_force_is_read_as_every_boolean_is(admin_api, node_fleet, gpu_node):
    node = gpu_node(node_fleet)
    Node.objects.filter(pk=node.pk).update(scheduling_state=SchedulingState.GONE)
    refused = admin_api.delete(f"/api/nodes/{node.id}?force=maybe")
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "force"
    assert admin_api.delete(f"/api/nodes/{node.id}?force=False").status_code == 409
    assert admin_api.delete(f"/api/nodes/{node.id}?force=True").status_code == 200


@pytest.mark.parametrize(("spelled", "mapped"), [("True", True), ("1", True), ("no", False)])
def test_J4_card_names_mapped_is_read_as_every_boolean_is(member_api, spelled, mapped):
    CardAlias.objects.create(name="Mystery X1")  # no series yet
    names = member_api.get(f"/api/card-names?mapped={spelled}&limit=1000").json()["results"]
    assert names and all((name["series"] is not None) is mapped for name in names)
    refused = member_api.get("/api/card-names?mapped=maybe")
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "mapped"
