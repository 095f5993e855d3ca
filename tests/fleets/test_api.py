"""The Fleet API: DESIGN.md §4 and the F-rules of §5."""

import logging

import pytest

from audit.models import AuditEvent
from fleets.choices import FleetState
from fleets.deletion import register_deletion_blocker, unregister_deletion_blocker
from fleets.models import Fleet
from tests.api_contract import ApiResourceContract

PRODUCT_PAGE_BODY = {
    "id": "gpu-lab",
    "kind": "node",
    "delivery": "shared-mount",
    "capabilities": ["train", "serve"],
}
FLEET_FIELDS = {
    "id",
    "kind",
    "delivery",
    "capabilities",
    "visibility",
    "project",
    "state",
    "config",
    "created_at",
    "updated_at",
}


class TestFleetContract(ApiResourceContract):
    list_path = "/api/fleets"
    list_reader = "member_api"
    create_action = "fleet.created"

    def detail_path(self, target_id):
        return f"/api/fleets/{target_id}"

    def create_body(self):
        return {"id": "new-fleet", "kind": "slurm", "capabilities": ["train"]}

    def patch_body(self):
        return {"capabilities": ["eval"]}

    def make_visible(self):
        return self.make_fleet("visible", capabilities=["train"]).id

    def make_listed(self, n):
        self.make_fleet(f"listed-{n}", visibility="project", project=self.project)

    def nested_paths(self, target_id):
        return [
            ("GET", f"/api/fleets/{target_id}/join-tokens"),
            ("POST", f"/api/fleets/{target_id}/join-tokens"),
        ]

    def make_invisible(self):
        from tuneplane.models import Project

        other = Project.objects.create(slug="secret", name="Secret project")
        return self.make_fleet("hidden-lab", visibility="project", project=other).id


def test_product_page_request_creates_the_fleet(admin_api):
    response = admin_api.post("/api/fleets", PRODUCT_PAGE_BODY)
    assert response.status_code == 201, response.content
    body = response.json()
    assert FLEET_FIELDS | {"warnings"} <= set(body)
    assert body["id"] == "gpu-lab" and body["kind"] == "node"
    assert body["delivery"] == "shared-mount"
    assert sorted(body["capabilities"]) == ["serve", "train"]
    assert body["visibility"] == "public" and body["project"] is None
    assert body["state"] == "active" and body["config"] == {} and body["warnings"] == []
    assert Fleet.objects.get(pk="gpu-lab").capabilities == ["serve", "train"]


def test_trailing_slash_is_optional_and_post_is_never_redirected(admin_api):
    assert admin_api.post("/api/fleets/", PRODUCT_PAGE_BODY).status_code == 201
    assert admin_api.get("/api/fleets/gpu-lab/").status_code == 200
    assert admin_api.get("/api/fleets/gpu-lab").status_code == 200
    assert admin_api.patch("/api/fleets/gpu-lab/", {"state": "draining"}).status_code == 200


@pytest.mark.parametrize(
    "kind, delivery",
    [("node", "shared-mount"), ("slurm", "shared-mount"), ("kubernetes", "object-pull")],
)
def test_F2_delivery_follows_the_kind_unless_given(admin_api, kind, delivery):
    response = admin_api.post("/api/fleets", {"id": kind, "kind": kind})
    assert response.status_code == 201
    assert response.json()["delivery"] == delivery
    chosen = "object-pull" if delivery == "shared-mount" else "shared-mount"
    response = admin_api.post("/api/fleets", {"id": f"{kind}-2", "kind": kind, "delivery": chosen})
    assert response.json()["delivery"] == chosen


@pytest.mark.parametrize("field, value", [("kind", "slurm"), ("delivery", "object-pull")])
def test_F1_kind_and_delivery_never_change(admin_api, make_fleet, field, value):
    make_fleet("gpu-lab", capabilities=["train"])
    events = AuditEvent.objects.count()
    response = admin_api.patch(
        "/api/fleets/gpu-lab", {field: value, "capabilities": ["serve"], "state": "disabled"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["field"] == field and error["rule"] == "F1" and error["code"] == "immutable"
    assert "cannot change" in error["message"]
    fleet = Fleet.objects.get(pk="gpu-lab")
    assert (fleet.kind, fleet.delivery) == ("node", "shared-mount")
    assert fleet.capabilities == ["train"] and fleet.state == "active"
    assert AuditEvent.objects.count() == events


def test_F1_sending_back_the_same_kind_is_not_a_change(admin_api, make_fleet):
    make_fleet("gpu-lab")
    response = admin_api.patch(
        "/api/fleets/gpu-lab", {"kind": "node", "delivery": "shared-mount", "state": "draining"}
    )
    assert response.status_code == 200 and response.json()["state"] == "draining"


def test_patch_changes_what_may_change_and_audits_before_and_after(admin_api, make_fleet, project):
    make_fleet("gpu-lab", capabilities=["train"])
    response = admin_api.patch(
        "/api/fleets/gpu-lab",
        {
            "capabilities": ["serve", "train", "env"],
            "visibility": "project",
            "project": "ml",
            "state": "draining",
            "config": {"storage_root": "/mnt/shared"},
        },
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["capabilities"] == ["env", "serve", "train"] and body["project"] == "ml"
    event = AuditEvent.objects.get(action="fleet.updated")
    assert event.before["state"] == "active" and event.after["state"] == "draining"
    assert event.before["project"] is None and event.after["project"] == "ml"
    assert event.actor_label == "ops" and event.target_id == "gpu-lab"
    back = admin_api.patch("/api/fleets/gpu-lab", {"visibility": "public"})
    assert back.json()["project"] is None


def test_patch_that_changes_nothing_writes_no_audit_event(admin_api, make_fleet):
    make_fleet("gpu-lab", capabilities=["train"])
    assert admin_api.patch("/api/fleets/gpu-lab", {"capabilities": ["train"]}).status_code == 200
    assert not AuditEvent.objects.filter(action="fleet.updated").exists()


def test_F3_capabilities_are_a_subset_of_the_four(admin_api):
    response = admin_api.post(
        "/api/fleets",
        {"id": "a", "kind": "node", "capabilities": ["train", "eval", "serve", "env"]},
    )
    assert response.status_code == 201
    for bad in (["gpu"], ["train", "train"], "train", [1]):
        response = admin_api.post("/api/fleets", {"id": "b", "kind": "node", "capabilities": bad})
        assert response.status_code == 400, bad
        assert response.json()["error"]["field"].startswith("capabilities"), bad
    assert not Fleet.objects.filter(pk="b").exists()


def test_F4_unknown_config_key_is_saved_logged_and_returned(admin_api, caplog):
    caplog.set_level(logging.WARNING, logger="tuneplane.fleets")
    response = admin_api.post(
        "/api/fleets", {"id": "gpu-lab", "kind": "node", "config": {"storage_rot": "/mnt/x"}}
    )
    assert response.status_code == 201
    warnings = response.json()["warnings"]
    assert [w["key"] for w in warnings] == ["storage_rot"]
    assert warnings[0]["code"] == "unknown_config_key"
    assert "Did you mean 'storage_root'" in warnings[0]["message"]
    assert Fleet.objects.get(pk="gpu-lab").config == {"storage_rot": "/mnt/x"}
    records = [r for r in caplog.records if r.name == "tuneplane.fleets"]
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    assert "gpu-lab" in records[0].getMessage() and "storage_rot" in records[0].getMessage()
    assert (records[0].fleet, records[0].config_key) == ("gpu-lab", "storage_rot")


def test_F4_a_key_read_only_by_another_kind_warns_naming_that_kind(admin_api):
    response = admin_api.post(
        "/api/fleets",
        {"id": "gpu-lab", "kind": "node", "config": {"slurm_rest_url": "http://x:6820"}},
    )
    assert response.status_code == 201
    assert "only for slurm Fleets" in response.json()["warnings"][0]["message"]


@pytest.mark.parametrize(
    "config, field",
    [
        ({"storage_root": 5}, "config.storage_root"),
        ({"storage_root": "relative/path"}, "config.storage_root"),
        ({"storage_root": ["/a"]}, "config.storage_root"),
    ],
)
def test_F4_known_key_with_wrong_type_is_400(admin_api, config, field):
    response = admin_api.post("/api/fleets", {"id": "gpu-lab", "kind": "node", "config": config})
    assert response.status_code == 400
    assert response.json()["error"]["field"] == field
    assert not Fleet.objects.exists()


def test_F4_slurm_and_kubernetes_keys_are_checked(admin_api):
    good = {
        "slurm_rest_url": "http://127.0.0.1:6820",
        "slurm_api_version": "v0.0.38",
        "slurm_partition": "debug",
        "slurm_user": "root",
        "slurm_token_env": "TUNEPLANE_TOKEN_SLURM",
    }
    assert (
        admin_api.post("/api/fleets", {"id": "s", "kind": "slurm", "config": good}).json()[
            "warnings"
        ]
        == []
    )
    bad = admin_api.post(
        "/api/fleets", {"id": "s2", "kind": "slurm", "config": {**good, "slurm_api_version": "38"}}
    )
    assert bad.json()["error"]["field"] == "config.slurm_api_version"
    kube = admin_api.post(
        "/api/fleets",
        {
            "id": "k",
            "kind": "kubernetes",
            "config": {"kube_api_url": "https://k8s:6443", "kuberay_namespace": "Ray_NS"},
        },
    )
    assert kube.json()["error"]["field"] == "config.kuberay_namespace"


def test_F7_a_registered_blocker_stops_deletion_with_409(admin_api, make_fleet):
    make_fleet("gpu-lab")

    def blocker(fleet):
        return ["2 nodes (n-1, n-2)"] if fleet.id == "gpu-lab" else []

    register_deletion_blocker(blocker)
    try:
        response = admin_api.delete("/api/fleets/gpu-lab")
    finally:
        unregister_deletion_blocker(blocker)
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["rule"] == "F7" and error["blockers"] == ["2 nodes (n-1, n-2)"]
    assert "2 nodes (n-1, n-2)" in error["message"]
    assert Fleet.objects.filter(pk="gpu-lab").exists()
    assert not AuditEvent.objects.filter(action="fleet.deleted").exists()


def test_F7_unblocked_delete_removes_and_audits(admin_api, make_fleet):
    make_fleet("gpu-lab", capabilities=["train"])
    assert admin_api.delete("/api/fleets/gpu-lab").status_code == 204
    assert not Fleet.objects.exists()
    event = AuditEvent.objects.get(action="fleet.deleted")
    assert event.before["capabilities"] == ["train"] and event.after is None
    assert admin_api.get("/api/fleets/gpu-lab").status_code == 404


def test_F8_project_fleet_visible_to_members_and_admins_only(
    make_fleet, project, admin_api, member_api, outsider_api
):
    make_fleet("public-lab")
    make_fleet("ml-lab", visibility="project", project=project)
    ids = {"admin": admin_api, "member": member_api, "outsider": outsider_api}
    seen = {
        who: [f["id"] for f in api.get("/api/fleets").json()["results"]] for who, api in ids.items()
    }
    assert seen == {
        "admin": ["ml-lab", "public-lab"],
        "member": ["ml-lab", "public-lab"],
        "outsider": ["public-lab"],
    }
    assert member_api.get("/api/fleets/ml-lab").json()["project"] == "ml"
    hidden = outsider_api.get("/api/fleets/ml-lab")
    missing = outsider_api.get("/api/fleets/no-lab")
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["error"]["code"] == "not_found"
    assert hidden.content.replace(b"ml-lab", b"X") == missing.content.replace(b"no-lab", b"X")


def test_F8_outsider_filtering_by_project_learns_nothing(make_fleet, project, outsider_api):
    make_fleet("ml-lab", visibility="project", project=project)
    assert outsider_api.get("/api/fleets?project=ml").json()["results"] == []


def test_list_filters(make_fleet, admin_api):
    make_fleet("a", kind="node", state=FleetState.DRAINING)
    make_fleet("b", kind="slurm")
    assert [f["id"] for f in admin_api.get("/api/fleets?kind=slurm").json()["results"]] == ["b"]
    assert [f["id"] for f in admin_api.get("/api/fleets?state=draining").json()["results"]] == ["a"]
    bad = admin_api.get("/api/fleets?kind=k8s")
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "kind"


def _list_queries(api, count):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        response = api.get("/api/fleets")
    assert response.status_code == 200 and response.json()["count"] == count
    return len(queries)


def test_fleet_list_query_count_does_not_grow_with_fleets(
    make_fleet, project, member_api, django_assert_max_num_queries
):
    member_api.get("/api/fleets")  # the token's first use records last_used_at once
    for i in range(3):
        make_fleet(f"f{i}", visibility="project", project=project)
    few = _list_queries(member_api, 3)
    for i in range(3, 40):
        make_fleet(f"f{i}", visibility="project", project=project)
    many = _list_queries(member_api, 40)
    assert few == many
    with django_assert_max_num_queries(3):  # token, count, page
        member_api.get("/api/fleets")


def test_issue17_item2_members_get_a_fleet_without_its_config_admins_see_it(
    make_fleet, member_api, admin_api
):
    config = {
        "slurm_rest_url": "http://slurm.internal:6820",
        "slurm_token_env": "TUNEPLANE_TOKEN_HPC",
    }
    make_fleet("hpc", kind="slurm", capabilities=["train"], config=config)
    for path in ("/api/fleets", "/api/fleets/hpc"):
        shown = member_api.get(path)
        assert shown.status_code == 200
        assert "slurm.internal" not in shown.content.decode()
        assert "TUNEPLANE_TOKEN_HPC" not in shown.content.decode()
    member_view = member_api.get("/api/fleets/hpc").json()
    assert set(member_view) == FLEET_FIELDS - {"config"}
    assert admin_api.get("/api/fleets/hpc").json()["config"] == config
    assert admin_api.get("/api/fleets").json()["results"][0]["config"] == config
