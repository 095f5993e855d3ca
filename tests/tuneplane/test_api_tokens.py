"""API tokens: printed once by create_api_token, stored only as a hash, revocable."""

import io

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from audit.models import AuditEvent
from audit.services import Actor
from tuneplane.models import ApiToken
from tuneplane.services import api_token_revoke


def create_token(username) -> str:
    out, err = io.StringIO(), io.StringIO()
    call_command("create_api_token", username, stdout=out, stderr=err)
    assert "shown this once" in err.getvalue()
    return out.getvalue().strip()


def bearer(secret):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_token_is_printed_once_and_stored_only_as_its_hash(admin_user):
    secret = create_token("ops")
    assert secret.startswith("tpa_") and len(secret) > 40
    token = ApiToken.objects.get()
    stored = [str(getattr(token, f.attname)) for f in ApiToken._meta.fields]
    assert all(secret not in value for value in stored)
    assert token.prefix == secret[:12]
    assert bearer(secret).get("/api/fleets").status_code == 200
    event = AuditEvent.objects.get(action="api_token.created")
    assert secret not in str(event.after) and event.actor_type == "system"


def test_product_page_curl_with_the_printed_token(admin_user):
    secret = create_token("ops")
    response = bearer(secret).post(
        "/api/fleets",
        '{"id": "gpu-lab", "kind": "node", "delivery": "shared-mount", '
        '"capabilities": ["train", "serve"]}',
        content_type="application/json",
    )
    assert response.status_code == 201


def test_revoked_token_is_refused(admin_user):
    secret = create_token("ops")
    api_token_revoke(actor=Actor.system("tests"), token=ApiToken.objects.get())
    assert bearer(secret).get("/api/fleets").status_code == 401
    assert AuditEvent.objects.filter(action="api_token.revoked").count() == 1


def test_token_of_a_deactivated_user_is_refused(admin_user):
    secret = create_token("ops")
    admin_user.is_active = False
    admin_user.save()
    assert bearer(secret).get("/api/fleets").status_code == 401


def test_unknown_user_is_a_clear_error(db):
    with pytest.raises(CommandError, match="no user 'ghost'"):
        call_command("create_api_token", "ghost")
