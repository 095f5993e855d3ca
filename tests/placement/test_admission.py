"""Admission: one test per row of the product page's "Choosing a Fleet" table, then the gates.

P1–P7, F3, F7, F8, L1–L3, D1, J4.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from fleets.choices import FleetState
from fleets.models import Fleet
from nodes.choices import SchedulingState
from nodes.models import CardAlias, Node
from nodes.services.control import node_report_inventory
from nodes.services.cordons import node_cordon
from nodes.services.join import node_join
from nodes.services.sessions import session_open
from placement.models import Deployment, TrainingJob
from tests.conftest import H100_INVENTORY, SERVE, SYSTEM, make_csr, with_devices

A100_INVENTORY = {**H100_INVENTORY, "cards": [{"name": "NVIDIA A100-SXM4-80GB", "count": 4}]}


@pytest.fixture
def placeable(mint):
    """A node that may take work now: joined, a live lease, inventory observed just now."""

    def make(fleet, inventory=H100_INVENTORY):
        inventory = with_devices(inventory)
        result = node_join(
            token=mint(fleet)[1],
            fleet_id=fleet.id,
            csr=make_csr()[1],
            inventory=inventory,
            address="10.0.0.1:1",
        )
        session_open(node_id=result.node.id, serial=result.certificate.serial, gateway="test")
        return node_report_inventory(node_id=result.node.id, inventory=inventory)

    return make


@pytest.fixture
def fleet(make_fleet, placeable):
    """A Fleet with one placeable node of 8 × H100."""

    def make(fleet_id, capabilities, kind="node", inventory=H100_INVENTORY, nodes=1, **fields):
        made = make_fleet(fleet_id, kind=kind, capabilities=capabilities, **fields)
        for _ in range(nodes if kind == "node" else 0):
            placeable(made, inventory)
        return made

    return make


def runs(path: str) -> dict:
    """A job on a node Fleet says what it runs (DESIGN §7)."""
    if path in ("deployments", "playground-sessions"):
        return SERVE
    return {"command": ["true"]} if path.endswith("-jobs") else {}


def submit(api, path, **body):
    return api.post(f"/api/{path}", {"project": "ml", "name": "w", **runs(path), **body})


def refusal(response, reason):
    assert response.status_code == 422, response.content
    error = response.json()["error"]
    assert (error["code"], error["reason"]) == ("placement_refused", reason), error
    return error


# -- the table, row by row ---------------------------------------------------------------


def test_P1_training_job_placed_among_visible_fleets_that_train_fit_and_are_active(
    fleet, member_api, project
):
    fleet("serve-only", ["serve"])
    fleet("drained", ["train"], state="draining")
    fleet("small", ["train"], inventory=A100_INVENTORY)
    fleet("big-lab", ["train"], nodes=2)
    fleet("gpu-lab", ["train"])
    response = submit(member_api, "training-jobs", series="h100", cards=8)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["fleet"] == "big-lab"  # most fitting cards, then id: deterministic
    assert body["admission"]["gates"] == ["visibility", "capability", "state", "inventory_fit"]
    assert TrainingJob.objects.get().fleet_id == "big-lab"
    assert AuditEvent.objects.filter(action="trainingjob.admitted").count() == 1


@pytest.mark.parametrize(
    "kind, capability", [("eval", "eval"), ("export", "train"), ("merge", "train")]
)
def test_P1_lifecycle_job_same_placement_same_gates(fleet, member_api, project, kind, capability):
    fleet("evals", ["eval"])
    fleet("trains", ["train"])
    response = submit(member_api, "lifecycle-jobs", kind=kind, series="h100", cards=1)
    assert response.status_code == 201, response.content
    assert response.json()["fleet"] == ("evals" if capability == "eval" else "trains")


def test_P2_deployment_named_by_the_submitter(fleet, member_api, project):
    fleet("serve-a", ["serve"])
    fleet("serve-b", ["serve"])
    response = submit(member_api, "deployments", fleet="serve-b", series="h100", cards=1)
    assert response.status_code == 201 and response.json()["fleet"] == "serve-b"


def test_P2_one_serving_fleet_is_chosen_for_them(fleet, member_api, project):
    fleet("serve-a", ["serve"])
    fleet("trains", ["train"])
    body = submit(member_api, "deployments", cards=1).json()
    # Not Ready before its replica runs and passes its probe (S1: tests/placement/test_serving)
    assert body["fleet"] == "serve-a" and body["status"] == "degraded"


def test_P2_with_more_than_one_an_unnamed_deployment_is_refused(fleet, member_api, project):
    fleet("serve-a", ["serve"])
    fleet("serve-b", ["serve"])
    error = refusal(submit(member_api, "deployments", cards=1), "fleet_not_named")
    assert error["candidates"] == ["serve-a", "serve-b"]
    assert not Deployment.objects.exists()


def test_P2_none_serving_or_a_named_fleet_without_serve_is_capability(fleet, member_api, project):
    fleet("trains", ["train"])
    refusal(submit(member_api, "deployments", cards=1), "capability")
    error = refusal(submit(member_api, "deployments", fleet="trains", cards=1), "capability")
    assert "F3" in error["message"]


def test_P2_a_deployment_never_changes_fleet(fleet, member_api, project):
    fleet("serve-a", ["serve"])
    fleet("serve-b", ["train"])
    made = submit(member_api, "deployments", cards=1).json()
    response = member_api.patch(f"/api/deployments/{made['id']}", {"fleet": "serve-b"})
    assert response.status_code == 400
    assert response.json()["error"]["rule"] == "P2"
    assert Deployment.objects.get().fleet_id == "serve-a"


def test_P3_volumes_and_datasets_are_not_placed_and_reach_a_job_through_delivery(
    fleet, member_api, project
):
    fleet("shared", ["train"], config={"storage_root": "/mnt/lab"})
    assert member_api.post("/api/volumes", {"project": "ml", "name": "ckpt"}).status_code == 201
    made = member_api.post(
        "/api/datasets", {"project": "ml", "name": "tokens", "uri": "s3://corp/tokens"}
    )
    assert made.status_code == 201 and "fleet" not in made.json()
    body = submit(
        member_api, "training-jobs", cards=1, volumes=["ckpt"], datasets=["tokens"]
    ).json()
    assert body["delivery"] == [
        {
            "kind": "volume",
            "name": "ckpt",
            "delivery": "shared-mount",
            "path": "/mnt/lab/ml/volumes/ckpt",
        },
        {
            "kind": "dataset",
            "name": "tokens",
            "delivery": "shared-mount",
            "path": "/mnt/lab/ml/datasets/tokens",
        },
    ]
    Fleet.objects.filter(pk="shared").update(state=FleetState.DISABLED)
    fleet("pull", ["train"], delivery="object-pull")
    body = submit(member_api, "training-jobs", cards=1, datasets=["tokens"]).json()
    assert body["delivery"] == [
        {"kind": "dataset", "name": "tokens", "delivery": "object-pull", "uri": "s3://corp/tokens"}
    ]
    missing = submit(member_api, "training-jobs", cards=1, volumes=["nope"])
    assert missing.status_code == 400 and missing.json()["error"]["field"] == "volumes"


def test_P4_playground_among_serving_node_and_kubernetes_fleets_never_slurm(
    fleet, member_api, project
):
    fleet("hpc", ["serve"], kind="slurm")
    refusal(submit(member_api, "playground-sessions", cards=1), "capability")
    fleet("serve-a", ["serve"])
    assert submit(member_api, "playground-sessions", cards=1).json()["fleet"] == "serve-a"


def test_P5_environment_named_in_its_manifest_must_declare_env_and_resolves_live(
    fleet, member_api, project
):
    fleet("trains", ["train"])
    envs = fleet("envs", ["env"])
    missing = member_api.post("/api/environments", {"project": "ml", "name": "e", "manifest": {}})
    assert missing.status_code == 400
    assert missing.json()["error"]["field"] == "manifest.fleet"
    refusal(
        member_api.post(
            "/api/environments", {"project": "ml", "name": "e", "manifest": {"fleet": "trains"}}
        ),
        "capability",
    )
    made = member_api.post(
        "/api/environments", {"project": "ml", "name": "e", "manifest": {"fleet": "envs"}}
    ).json()
    assert made["fleet"] == "envs"
    resolved = member_api.post(f"/api/environments/{made['id']}/resolve").json()
    node = Node.objects.get(fleet=envs)
    assert resolved["node"] == node.id and resolved["address"] == "10.0.0.1:1"
    Node.objects.filter(pk=node.pk).update(quiet_env=True)  # L3
    refusal(member_api.post(f"/api/environments/{made['id']}/resolve"), "no_node_answering")


# -- gates ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, body",
    [
        ("training-jobs", {"cards": 1}),
        ("lifecycle-jobs", {"kind": "eval", "cards": 1}),
        ("deployments", {"fleet": "FLEET", "cards": 1}),
        ("playground-sessions", {"cards": 1}),
        ("environments", {"manifest": {"fleet": "FLEET"}}),
    ],
)
def test_F8_an_invisible_fleet_answers_exactly_as_a_missing_one(
    fleet, member_api, project, path, body
):
    from tuneplane.models import Project

    other = Project.objects.create(slug="secret", name="Secret")
    fleet("hidden", ["train", "eval", "serve", "env"], visibility="project", project=other)
    if "fleet" in body or "manifest" in body:

        def named(name):
            return {
                key: name if value == "FLEET" else {"fleet": name} if key == "manifest" else value
                for key, value in body.items()
            }

        hidden = submit(member_api, path, **named("hidden"))
        missing = submit(member_api, path, **named("nothing"))
        assert hidden.status_code == missing.status_code == 404
        assert hidden.content.replace(b"hidden", b"X") == missing.content.replace(b"nothing", b"X")
    else:
        # Automatic placement never counts, names or hints at it.
        error = refusal(submit(member_api, path, **body), "capability")
        assert "hidden" not in str(error)


def test_D1_a_draining_or_disabled_fleet_is_refused_with_state(fleet, member_api, project):
    fleet("gpu-lab", ["train", "serve"], state="draining")
    refusal(submit(member_api, "training-jobs", cards=1), "state")
    refusal(submit(member_api, "deployments", fleet="gpu-lab", cards=1), "state")


def test_P6_inventory_fit_refusal_names_the_best_offer_among_visible_fleets_only(
    fleet, member_api, project
):
    from tuneplane.models import Project

    fleet("gpu-lab", ["train"])
    other = Project.objects.create(slug="secret", name="Secret")
    fleet(
        "hidden",
        ["train"],
        visibility="project",
        project=other,
        nodes=1,
        inventory={**H100_INVENTORY, "cards": [{"name": "NVIDIA H100 80GB HBM3", "count": 16}]},
    )
    error = refusal(submit(member_api, "training-jobs", series="h100", cards=12), "inventory_fit")
    assert error["best_offer"] == "largest fit: 8 × h100 on one node in gpu-lab"
    assert "hidden" not in str(error) and "16" not in str(error)


def test_P6_refusals_are_the_body_the_openapi_document_promises(fleet, member_api, project):
    """Every refusal reason's body validates against the schema's PlacementRefusal, and says
    nothing the schema does not name."""
    from jsonschema import Draft202012Validator

    document = member_api.get("/api/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    components = document.json()["components"]
    validator = Draft202012Validator(
        {"$ref": "#/components/schemas/PlacementRefusal", "components": components}
    )
    documented = set(components["schemas"]["PlacementRefusalDetail"]["properties"])
    fleet("serve-a", ["serve"])
    fleet("serve-b", ["serve"], state="draining")
    bodies = [
        refusal(submit(member_api, "deployments", cards=1), "fleet_not_named"),
        refusal(submit(member_api, "deployments", fleet="serve-b"), "state"),
        refusal(submit(member_api, "training-jobs", cards=1), "capability"),
        refusal(submit(member_api, "deployments", fleet="serve-a", cards=64), "inventory_fit"),
    ]
    for error in bodies:
        validator.validate({"error": error})
        assert set(error) <= documented, set(error) - documented


def queued_never_placed(response) -> dict:
    """P8, L1: admitted, and the allocator places nothing: why it waits."""
    from placement.services.allocator import allocate

    assert response.status_code == 201, response.content
    job = TrainingJob.objects.get(pk=response.json()["id"])
    assert allocate(fleet_id=job.fleet_id)["allocated"] == 0
    job.refresh_from_db()
    assert job.state == "queued"
    return job.waiting


def test_L1_P8_stale_inventory_is_admitted_but_never_placed_though_the_node_shows_schedulable(
    fleet, member_api, project
):
    made = fleet("gpu-lab", ["train"])
    Node.objects.filter(fleet=made).update(
        inventory_observed_at=timezone.now() - timedelta(seconds=46)
    )
    assert Node.objects.get(fleet=made).scheduling_state == SchedulingState.SCHEDULABLE
    wait = queued_never_placed(submit(member_api, "training-jobs", cards=1))
    assert wait["reason"] == "node_unreachable"


def test_L1_P8_a_closed_stream_is_waited_for_never_placed_on(fleet, member_api, project):
    from nodes.models import ControlSession
    from nodes.services.sessions import session_close

    fleet("gpu-lab", ["train"])
    session_close(session_id=ControlSession.objects.get().id, reason="stream ended")
    wait = queued_never_placed(submit(member_api, "training-jobs", cards=1))
    assert wait["reason"] == "node_unreachable"


def test_L1_P8_a_lease_past_its_end_fits_but_not_now_though_inventory_is_fresh(
    fleet, member, project
):
    from fleets.models import Fleet
    from nodes.models import ControlSession
    from placement.admission import Holdings, Need

    fleet("gpu-lab", ["train"])
    session = ControlSession.objects.get()
    Node.objects.update(inventory_observed_at=session.lease_expires_at)
    need, fleets = Need("train", "h100", 1), list(Fleet.objects.all())
    before = session.lease_expires_at - timedelta(seconds=1)
    after = session.lease_expires_at + timedelta(seconds=1)
    fit = Holdings(fleets, need, before).per_fleet()["gpu-lab"]
    assert fit.fits(need) and fit.fits_now(need)
    fit = Holdings(fleets, need, after).per_fleet()["gpu-lab"]
    assert fit.fits(need) and not fit.fits_now(need)


@pytest.mark.parametrize(
    "how, waits",
    [
        ("cordoned", "cordoned"),
        ("storage", "cordoned"),
        ("gone", "node_unreachable"),
        ("draining", None),
        ("drained", None),
    ],
)
def test_D1_P8_a_cordoned_or_gone_node_is_waited_for_and_a_leaving_one_never_fits(
    fleet, member_api, project, how, waits
):
    from nodes.services.cordons import node_observe_storage_root

    made = fleet("gpu-lab", ["train"], delivery="shared-mount")
    node = Node.objects.get(fleet=made)
    if how == "cordoned":
        node_cordon(actor=SYSTEM, node=node, reason="fan")
    elif how == "storage":
        node_observe_storage_root(node_id=node.id, visible=False)
    else:
        Node.objects.filter(pk=node.pk).update(scheduling_state=how)
    response = submit(member_api, "training-jobs", cards=1)
    if waits is None:
        refusal(response, "inventory_fit")
    else:
        assert queued_never_placed(response)["reason"] == waits


def test_J4_an_unmapped_card_never_fits_a_pinned_series_and_fits_once_mapped(
    fleet, member_api, project
):
    from nodes.models import HardwareSeries
    from nodes.services.hardware import card_alias_map

    mystery = {**H100_INVENTORY, "cards": [{"name": "Mystery X1", "count": 8}]}
    fleet("gpu-lab", ["train"], inventory=mystery)
    assert submit(member_api, "training-jobs", cards=8).status_code == 201  # no series pinned
    refusal(submit(member_api, "training-jobs", series="h100", cards=8), "inventory_fit")
    card_alias_map(
        actor=SYSTEM,
        alias=CardAlias.objects.get(name="Mystery X1"),
        series=HardwareSeries.objects.get(slug="h100"),
    )
    assert submit(member_api, "training-jobs", series="h100", cards=8).status_code == 201


def test_P1_multi_node_fit_needs_that_many_fitting_nodes(fleet, member_api, project):
    fleet("gpu-lab", ["train"], nodes=2)
    assert submit(member_api, "training-jobs", series="h100", cards=8, nodes=2).status_code == 201
    refusal(submit(member_api, "training-jobs", series="h100", cards=8, nodes=3), "inventory_fit")


def test_F7_a_fleet_with_a_live_deployment_cannot_be_deleted(fleet, admin_api, member_api, project):
    made = fleet("serve-a", ["serve"], nodes=0)
    Node.objects.filter(fleet=made).delete()
    from placement.models import Revision

    deployment = Deployment.objects.create(project=project, fleet=made, name="d", cards=0)
    Revision.objects.create(deployment=deployment, number=1)
    response = admin_api.delete("/api/fleets/serve-a")
    assert response.status_code == 409
    assert "1 live deployment" in response.json()["error"]["message"]
    assert Fleet.objects.filter(pk="serve-a").exists()


def test_a_project_the_submitter_is_not_in_reads_as_missing(fleet, outsider_api, project):
    fleet("gpu-lab", ["train"])
    response = submit(outsider_api, "training-jobs", cards=1)
    assert response.status_code == 404 and "Project 'ml' not found" in response.content.decode()


def test_admission_queries_do_not_grow_with_nodes_or_fleets(
    fleet, member_api, project, django_assert_max_num_queries
):
    fleet("gpu-lab", ["train"])
    submit(member_api, "training-jobs", cards=1)
    with django_assert_max_num_queries(30) as few:
        submit(member_api, "training-jobs", cards=1)
    for index in range(6):
        fleet(f"more-{index}", ["train"], nodes=3)
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert submit(member_api, "training-jobs", cards=1).status_code == 201


def test_admin_lists_workloads(client, admin_user, fleet, member_api, project):
    fleet("serve-a", ["serve"])
    made = submit(member_api, "deployments", cards=1).json()
    client.force_login(admin_user)
    for path in (
        "trainingjob",
        "lifecyclejob",
        "deployment",
        "playgroundsession",
        "environment",
        "volume",
        "dataset",
    ):
        assert client.get(f"/admin/placement/{path}/").status_code == 200, path
    page = client.get(f"/admin/placement/deployment/{made['id']}/change/")
    assert page.status_code == 200 and b"serve-a" in page.content
