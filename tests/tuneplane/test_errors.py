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
    assert (
        generated["X-Request-ID"] != "bad id with spaces" and len(generated["X-Request-ID"]) == 32
    )


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


def test_a_nul_in_a_query_parameter_is_a_400_naming_it_not_a_500(admin_api):
    """Found by fuzzing: PostgreSQL refuses NUL in text, and that reached the database."""
    response = admin_api.get("/api/fleets?project=ml%00x")
    assert_error(response, 400, "invalid")
    assert response.json()["error"]["field"] == "project"
    assert_error(admin_api.get("/api/fleets?%00=1"), 400, "invalid")


def test_an_overlong_query_string_is_our_414_before_the_http_servers(admin_api):
    """Found by fuzzing: gunicorn answered such a request line with its own 414 page."""
    assert_error(admin_api.get("/api/nodes?limit=" + "9" * 3000), 414, "uri_too_long")
    assert admin_api.get("/api/nodes?limit=" + "9" * 10).status_code == 200


def test_every_operation_documents_the_refusals_made_before_its_view(client, db):
    document = client.get("/api/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    for path, item in document["paths"].items():
        for method, operation in item.items():
            assert {"400", "414", "503"} <= set(operation["responses"]), (method, path)
            # Found by fuzzing: past gunicorn's request line limit its own page answers.
            too_long = operation["responses"]["414"]["content"]
            assert {"application/json", "text/html"} <= set(too_long), (method, path)


@pytest.mark.django_db(transaction=True)
def test_issue17_item8_healthz_says_which_dependency_is_down_never_the_error_text(client):
    from django.db import connection

    real = connection.settings_dict["NAME"]
    connection.close()
    connection.settings_dict["NAME"] = "/no/such/dir/s3cr3t.sqlite3"  # neither engine opens it
    try:
        response = client.get("/healthz")
    finally:
        connection.close()
        connection.settings_dict["NAME"] = real
    assert response.status_code == 503
    assert response.json() == {"status": "unhealthy", "database": "unavailable"}
    assert b"s3cr3t" not in response.content
