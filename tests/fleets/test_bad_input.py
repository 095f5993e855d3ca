"""Bad input gets a clear error naming the field, and changes nothing."""

import json
import re

import pytest
from django.urls import URLResolver, get_resolver

from audit.models import AuditEvent
from fleets.models import Fleet

GOOD = {"id": "gpu-lab", "kind": "node"}


def nothing_written():
    return (
        not Fleet.objects.exists()
        and not AuditEvent.objects.filter(action__startswith="fleet.").exists()
    )


@pytest.mark.parametrize(
    "body, field",
    [
        ({**GOOD, "id": 5}, "id"),
        ({**GOOD, "id": None}, "id"),
        ({**GOOD, "kind": "k8s"}, "kind"),
        ({**GOOD, "kind": ["node"]}, "kind"),
        ({**GOOD, "delivery": "nfs"}, "delivery"),
        ({**GOOD, "capabilities": "train"}, "capabilities"),
        ({**GOOD, "capabilities": ["train", "gpu"]}, "capabilities[1]"),
        ({**GOOD, "capabilities": ["serve", "serve"]}, "capabilities"),
        ({**GOOD, "visibility": "private"}, "visibility"),
        ({**GOOD, "visibility": True}, "visibility"),
        ({**GOOD, "state": "paused"}, "state"),
        ({**GOOD, "config": ["storage_root"]}, "config"),
        ({**GOOD, "config": "storage_root=/x"}, "config"),
        ({**GOOD, "id": "GPU-Lab"}, "id"),
        ({**GOOD, "id": "-lab"}, "id"),
        ({**GOOD, "id": "lab-"}, "id"),
        ({**GOOD, "id": "gpu_lab"}, "id"),
        ({**GOOD, "id": ""}, "id"),
        ({**GOOD, "id": "a" * 64}, "id"),
        ({**GOOD, "visibility": "project"}, "project"),
        ({**GOOD, "visibility": "project", "project": "nope"}, "project"),
        ({**GOOD, "visibility": "project", "project": "p" * 64}, "project"),
        ({**GOOD, "project": "ml"}, "project"),
        ({**GOOD, "kindd": "node"}, "kindd"),
        ({"kind": "node"}, "id"),
        ({"id": "gpu-lab"}, "kind"),
        ([GOOD], "body"),
        ('"gpu-lab"', "body"),
    ],
)
def test_bad_create_is_400_naming_the_field_and_writes_nothing(admin_api, project, body, field):
    response = admin_api.post("/api/fleets", body)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert error["field"] == field, error
    assert error["message"]
    assert nothing_written()


@pytest.mark.parametrize("raw", ['{"id": "gpu-lab", "kind": ', "{'id': 'x'}", "NaN", "\x00"])
def test_malformed_json_is_400_and_writes_nothing(admin_api, raw):
    response = admin_api.post("/api/fleets", raw)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "parse_error"
    assert "JSON" in response.json()["error"]["message"]
    assert nothing_written()


def test_duplicate_id_is_409_and_keeps_the_first(admin_api):
    assert admin_api.post("/api/fleets", {**GOOD, "capabilities": ["train"]}).status_code == 201
    response = admin_api.post("/api/fleets", {**GOOD, "kind": "slurm"})
    assert response.status_code == 409
    assert response.json()["error"] == {
        "code": "already_exists",
        "field": "id",
        "message": "A Fleet with id 'gpu-lab' already exists.",
    }
    assert Fleet.objects.get().kind == "node"
    assert AuditEvent.objects.filter(action="fleet.created").count() == 1


def test_body_over_one_mebibyte_is_refused_unread(admin_api):
    body = json.dumps({**GOOD, "config": {"padding": "x" * (1024 * 1024)}})
    response = admin_api.post("/api/fleets", body)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert nothing_written()


def test_bad_patch_changes_nothing(admin_api, make_fleet):
    make_fleet("gpu-lab", capabilities=["train"])
    for body in (
        {"capabilities": ["train", "gpu"]},
        {"state": "on"},
        {"config": {"storage_root": 7}},
        {"visibility": "project"},
        {"capabilities": ["serve"], "bogus": 1},
        {"id": "renamed"},
    ):
        response = admin_api.patch("/api/fleets/gpu-lab", body)
        assert response.status_code == 400, body
    fleet = Fleet.objects.get()
    assert fleet.capabilities == ["train"] and fleet.state == "active" and fleet.config == {}
    assert not AuditEvent.objects.filter(action="fleet.updated").exists()


def test_wrong_content_type_is_415_with_the_error_body(admin_api):
    response = admin_api.client.post(
        "/api/fleets", "id=gpu-lab&kind=node", content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert nothing_written()


def api_routes(patterns=None, prefix=""):
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from api_routes(entry.url_patterns, route)
        elif route.startswith("api/"):
            yield route


def test_issue17_item6_deeply_nested_json_is_a_400_naming_the_body_on_every_endpoint(
    admin_api, anon_api, make_fleet
):
    make_fleet("gpu-lab", capabilities=["train"])
    deep = "[" * 100_000 + "]" * 100_000
    just_too_deep = json.dumps({"fleet": json.loads("[" * 40 + "]" * 40)})
    assert anon_api.post("/api/nodes/join", deep).status_code == 400
    tried = 0
    for route in api_routes():
        path = "/" + re.sub(
            r"<(?:\w+:)?(\w+)>", lambda m: "gpu-lab" if "fleet" in m[1] else "1", route
        )
        for method in ("POST", "PATCH"):
            for body in (deep, just_too_deep):
                response = admin_api.request(method, path, body)
                assert response.status_code != 500, (method, path)
                if response.status_code == 400:
                    tried += 1
                    assert response.json()["error"]["field"] == "body", (method, path)
    assert tried >= 20
