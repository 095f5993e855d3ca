"""Every error, DRF's own included, has the body {"error": {"code", "message"}}."""

import pytest


def assert_error(response, status, code):
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


def test_401_without_and_with_a_bad_token(anon_api):
    assert_error(anon_api.get("/api/fleets"), 401, "not_authenticated")
    anon_api.client.credentials(HTTP_AUTHORIZATION="Bearer tpa_not-a-token")
    assert_error(anon_api.get("/api/fleets"), 401, "authentication_failed")
    anon_api.client.credentials(HTTP_AUTHORIZATION="Bearer two parts")
    assert_error(anon_api.get("/api/fleets"), 401, "authentication_failed")


def test_403_for_a_member_on_the_audit_log(member_api):
    assert_error(member_api.get("/api/audit"), 403, "permission_denied")


def test_404_for_an_unknown_api_path(admin_api):
    assert_error(admin_api.get("/api/no-such-route"), 404, "not_found")
    assert_error(admin_api.get("/api"), 404, "not_found")


def test_405_for_a_method_a_route_does_not_have(admin_api, make_fleet):
    make_fleet("gpu-lab")
    assert_error(admin_api.request("PUT", "/api/fleets/gpu-lab", {}), 405, "method_not_allowed")
    assert_error(admin_api.post("/api/audit", {}), 405, "method_not_allowed")


def test_request_id_is_echoed(admin_api):
    response = admin_api.get("/api/fleets", HTTP_X_REQUEST_ID="trace-123")
    assert response["X-Request-ID"] == "trace-123"
    generated = admin_api.get("/api/fleets", HTTP_X_REQUEST_ID="bad id with spaces")
    assert generated["X-Request-ID"] != "bad id with spaces" and len(generated["X-Request-ID"]) == 32


@pytest.mark.parametrize("path", ["/healthz"])
def test_healthz_answers_without_login(client, db, path):
    response = client.get(path)
    assert response.status_code == 200 and response.json()["database"] == "ok"


def test_openapi_schema_and_docs(client, db):
    response = client.get("/api/schema")
    assert response.status_code == 200
    schema = response.content.decode()
    for path in ("/api/fleets:", "/api/fleets/{fleet_id}:", "/api/audit:"):
        assert path in schema
    assert "openapi: 3" in schema
    docs = client.get("/api/docs")
    assert docs.status_code == 200 and b"swagger-ui" in docs.content
    assert b"drf_spectacular_sidecar" in docs.content  # served locally, no CDN
