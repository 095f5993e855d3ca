"""Join tokens: minted for node Fleets only (J1), single-use, 24 h, hashed, shown once (J2)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from nodes.downloads import lock_sha256
from nodes.models import JoinToken


def test_J2_mint_shows_the_token_and_commands_once(admin_api, node_fleet, settings):
    settings.TUNEPLANE_PUBLIC_URL = "https://tuneplane.corp"
    response = admin_api.post("/api/fleets/gpu-lab/join-tokens")
    assert response.status_code == 201, response.content
    body = response.json()
    secret = body["token"]
    assert secret.startswith("tpj_") and len(secret) >= 40
    assert body["install_command"] == (
        f"curl -fsSL https://tuneplane.corp/install.sh | TUNEPLANE_FLEET=gpu-lab "
        f"TUNEPLANE_JOIN_TOKEN={secret} TUNEPLANE_AGENT_SHA256={lock_sha256()} sh"
    )
    assert body["join_command"] == (
        f"tuneplane-node join --server https://tuneplane.corp --fleet gpu-lab --token {secret}"
    )
    expires = timezone.datetime.fromisoformat(body["expires_at"])
    assert abs(expires - (timezone.now() + timedelta(hours=24))) < timedelta(minutes=1)
    assert response["Cache-Control"] == "no-store"

    token = JoinToken.objects.get()
    assert secret not in {token.digest, token.prefix} and token.prefix == secret[:12]
    listed = admin_api.get("/api/fleets/gpu-lab/join-tokens").json()["results"]
    assert len(listed) == 1 and secret not in str(listed)
    assert {"token", "install_command", "join_command"}.isdisjoint(listed[0])
    assert listed[0]["created_by"] == "ops" and listed[0]["used_at"] is None
    event = AuditEvent.objects.get(action="join_token.minted")
    assert secret not in str(event.after) and event.actor_label == "ops"


@pytest.mark.parametrize("kind", ["kubernetes", "slurm"])
def test_J1_cluster_fleets_refuse_to_mint(admin_api, make_fleet, kind):
    make_fleet("cluster", kind=kind)
    response = admin_api.post("/api/fleets/cluster/join-tokens")
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["rule"] == "J1" and "cluster manager" in error["message"]
    assert not JoinToken.objects.exists()


def test_only_admins_mint_and_list(member_api, node_fleet):
    assert member_api.post("/api/fleets/gpu-lab/join-tokens").status_code == 403
    assert member_api.get("/api/fleets/gpu-lab/join-tokens").status_code == 403
    assert not JoinToken.objects.exists()


def test_revoke(admin_api, member_api, node_fleet, mint):
    token, _ = mint(node_fleet)
    assert member_api.delete(f"/api/join-tokens/{token.pk}").status_code == 403
    response = admin_api.delete(f"/api/join-tokens/{token.pk}")
    assert response.status_code == 200 and response.json()["revoked_at"]
    assert AuditEvent.objects.filter(action="join_token.revoked").count() == 1
    assert admin_api.delete("/api/join-tokens/999999").status_code == 404
