"""POST /api/nodes/join: J2–J5, the generic refusal, and the console-issued credential."""

import logging
import uuid
from datetime import timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import Actor
from nodes import pki
from nodes.choices import SchedulingState
from nodes.models import CardAlias, HardwareSeries, Node, NodeCredential
from nodes.services.hardware import card_alias_map
from nodes.services.join import JOIN_REFUSED, join_token_revoke
from tests.conftest import H100_DEVICE_INVENTORY, H100_INVENTORY, make_csr


def join_body(secret, fleet="gpu-lab", **extra):
    _, csr = make_csr()
    return {
        "fleet": fleet,
        "token": secret,
        "csr": csr,
        "address": "10.0.0.7:9100",
        "hostname": "gpu-01",
        "inventory": H100_DEVICE_INVENTORY,
        **extra,
    }


def test_J3_join_returns_identity_and_a_bounded_credential_once(
    anon_api, node_fleet, mint, settings
):
    settings.TUNEPLANE_GATEWAY_TARGET = "control.tuneplane.corp:8443"
    token, secret = mint(node_fleet)
    response = anon_api.post("/api/nodes/join", join_body(secret))
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) >= {
        "node_id",
        "fleet",
        "certificate",
        "ca_bundle",
        "credential_expires_at",
        "gateway_target",
        "warnings",
    }
    assert body["gateway_target"] == "control.tuneplane.corp:8443" and body["warnings"] == []
    node = Node.objects.get()
    assert body["node_id"] == node.id and node.id.startswith("n-") and len(node.id) == 34
    assert (
        node.scheduling_state == SchedulingState.ENROLLED
    )  # enrollment alone does not make it ready

    cert = x509.load_pem_x509_certificate(body["certificate"].encode())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [
        f"spiffe://tuneplane/node/{node.id}"
    ]
    ca = x509.load_pem_x509_certificate(body["ca_bundle"].encode())
    cert.verify_directly_issued_by(ca)
    lifetime = cert.not_valid_after_utc - timezone.now()
    assert timedelta(hours=23) < lifetime <= timedelta(hours=24)

    credential = NodeCredential.objects.get(node=node)
    assert credential.serial == format(cert.serial_number, "x")
    assert credential.fingerprint_sha256 == cert.fingerprint(hashes.SHA256()).hex()
    token.refresh_from_db()
    assert token.used_at and token.node_id == node.id
    assert AuditEvent.objects.get(action="node.joined").actor_id == node.id


def test_J4_inventory_is_stored_with_its_observation_time(anon_api, admin_api, node_fleet, mint):
    _, secret = mint(node_fleet)
    anon_api.post("/api/nodes/join", join_body(secret))
    node = Node.objects.get()
    assert node.inventory["cards"] == [{"name": "NVIDIA H100 80GB HBM3", "count": 8}]
    assert node.inventory["driver"] == "550.54" and node.inventory_observed_at
    shown = admin_api.get(f"/api/nodes/{node.id}").json()
    assert shown["inventory"]["cards"] == [
        {"name": "NVIDIA H100 80GB HBM3", "count": 8, "series": "h100"}
    ]
    assert shown["connection"]["state"] == "disconnected"
    assert shown["scheduling"] == {"state": "enrolled", "cordons": [], "drain": None}
    assert set(shown) >= {"connection", "scheduling", "inventory", "liveness"}  # L7


def test_J4_unknown_card_is_named_and_mapping_takes_effect_without_rejoin(
    anon_api, admin_api, admin_user, node_fleet, mint
):
    _, secret = mint(node_fleet)
    name = "Tuneplane Test Card 9000"
    inventory = {
        **H100_INVENTORY,
        "cards": [{"name": name, "count": 2}],
        "devices": [{"index": i, "uuid": f"GPU-{i}-tc9000", "name": name} for i in range(2)],
    }
    body = anon_api.post("/api/nodes/join", join_body(secret, inventory=inventory)).json()
    assert [(w["code"], w["card"]) for w in body["warnings"]] == [
        ("unknown_card", "Tuneplane Test Card 9000")
    ]
    alias = CardAlias.objects.get(name="Tuneplane Test Card 9000")
    assert alias.series is None
    shown = admin_api.get(f"/api/nodes/{body['node_id']}").json()
    assert shown["inventory"]["cards"][0]["series"] is None
    series = HardwareSeries.objects.create(slug="tc9000", name="Test card")
    card_alias_map(actor=Actor.of_user(admin_user), alias=alias, series=series)
    shown = admin_api.get(f"/api/nodes/{body['node_id']}").json()
    assert shown["inventory"]["cards"][0]["series"] == "tc9000"
    assert AuditEvent.objects.filter(action="card_alias.mapped").count() == 1


def test_card_registry_maps_both_spellings_to_one_series(db):
    assert CardAlias.objects.get(name="NVIDIA H100 80GB HBM3").series.slug == "h100"
    assert CardAlias.objects.get(name="NVIDIA-H100-80GB-HBM3").series.slug == "h100"
    assert CardAlias.objects.get(name="NVIDIA-A100-SXM4-80GB").series.slug == "a100-80gb"


def test_J5_same_address_warns_and_still_joins(anon_api, node_fleet, mint):
    first = anon_api.post("/api/nodes/join", join_body(mint(node_fleet)[1])).json()
    second = anon_api.post("/api/nodes/join", join_body(mint(node_fleet)[1]))
    assert second.status_code == 201
    warnings = second.json()["warnings"]
    assert [(w["code"], w["node"]) for w in warnings] == [("address_in_use", first["node_id"])]
    assert Node.objects.count() == 2


def test_J5_an_address_quiet_past_the_window_does_not_warn(anon_api, node_fleet, mint):
    anon_api.post("/api/nodes/join", join_body(mint(node_fleet)[1]))
    Node.objects.update(last_seen_at=timezone.now() - timedelta(minutes=5))
    second = anon_api.post("/api/nodes/join", join_body(mint(node_fleet)[1])).json()
    assert second["warnings"] == []


def test_same_machine_fingerprint_warns_naming_the_old_record(anon_api, node_fleet, mint):
    first = anon_api.post(
        "/api/nodes/join",
        join_body(mint(node_fleet)[1], fingerprint="ab" * 32, address="10.0.0.7:1"),
    ).json()
    second = anon_api.post(
        "/api/nodes/join",
        join_body(mint(node_fleet)[1], fingerprint="ab" * 32, address="10.0.0.9:1"),
    ).json()
    assert [(w["code"], w["node"]) for w in second["warnings"]] == [
        ("same_machine", first["node_id"])
    ]


def refusal(response):
    assert response.status_code == 403, response.content
    assert response.json() == {"error": {"code": "join_refused", "message": JOIN_REFUSED}}
    return response.content


def test_J2_every_token_problem_reads_the_same(
    anon_api, node_fleet, make_fleet, mint, admin_user, monkeypatch
):
    other = make_fleet("other-lab")
    _, used = mint(node_fleet)
    assert anon_api.post("/api/nodes/join", join_body(used)).status_code == 201
    revoked_token, revoked = mint(node_fleet)
    join_token_revoke(actor=Actor.of_user(admin_user), token=revoked_token)
    _, foreign = mint(other)
    _, expiring = mint(node_fleet)
    bodies = {
        refusal(anon_api.post("/api/nodes/join", join_body(secret)))
        for secret in (used, revoked, foreign, "tpj_never-minted")
    }
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(hours=24, minutes=1))
    bodies.add(refusal(anon_api.post("/api/nodes/join", join_body(expiring))))
    assert len(bodies) == 1
    reasons = sorted(
        e.after["reason"] for e in AuditEvent.objects.filter(action="node.join_refused")
    )
    assert reasons == [
        "token already used",
        "token expired",
        "token is for another Fleet",
        "token revoked",
        "unknown token",
    ]
    assert Node.objects.count() == 1


def test_refusals_are_logged_without_the_token(anon_api, caplog):
    caplog.set_level(logging.DEBUG)
    secret = "tpj_guessing-at-tokens-0123456789"
    refusal(anon_api.post("/api/nodes/join", join_body(secret)))
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "join refused: unknown token" in logged and secret not in logged


def rsa_csr() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM).decode()


def p384_csr() -> str:
    key = ec.generate_private_key(ec.SECP384R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM).decode()


@pytest.mark.parametrize(
    "change, field",
    [
        ({"csr": "not a csr"}, "csr"),
        ({"csr": rsa_csr()}, "csr"),
        ({"csr": p384_csr()}, "csr"),
        ({"inventory": []}, "inventory"),
        ({"inventory": {"cards": [{"name": "x", "count": 0}]}}, "inventory.cards[0].count"),
        ({"inventory": {"cards": [{"name": "x", "count": "8"}]}}, "inventory.cards[0].count"),
        ({"inventory": {"gpus": 8}}, "inventory.gpus"),
        ({"inventory": {"storage_root_visible": "yes"}}, "inventory.storage_root_visible"),
        ({"token": 5}, "token"),
    ],
)
def test_malformed_join_is_400_before_the_token_is_looked_at(
    anon_api, node_fleet, mint, change, field
):
    token, secret = mint(node_fleet)
    response = anon_api.post("/api/nodes/join", {**join_body(secret), **change})
    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == field
    token.refresh_from_db()
    assert token.used_at is None and not Node.objects.exists()


def test_F7_a_fleet_with_nodes_cannot_be_deleted(anon_api, admin_api, node_fleet, mint):
    node_id = anon_api.post("/api/nodes/join", join_body(mint(node_fleet)[1])).json()["node_id"]
    response = admin_api.delete("/api/fleets/gpu-lab")
    assert response.status_code == 409
    assert response.json()["error"]["blockers"] == [f"1 node ({node_id}); remove them first"]


def test_join_is_throttled_per_address(anon_api, node_fleet, settings):
    settings.TUNEPLANE_JOIN_RATE = "5/minute"
    # Fresh addresses: the throttle counts in a cache that outlives one test run.
    burst, other_address = (f"2001:db8::{uuid.uuid4().hex[:4]}:{i}" for i in range(2))
    statuses = [
        anon_api.post("/api/nodes/join", join_body("tpj_guess"), REMOTE_ADDR=burst).status_code
        for _ in range(9)
    ]
    assert statuses.count(403) == 5 and statuses.count(429) == 4
    other = anon_api.post("/api/nodes/join", join_body("tpj_guess"), REMOTE_ADDR=other_address)
    assert other.status_code == 403


def test_join_stays_throttled_per_replica_while_the_cache_is_away(anon_api, node_fleet, settings):
    """Redis refusing connections: joins are answered (403 for a bad token), not 500, and
    the burst is still cut at the rate, counted in this process."""
    from tests.e2e.console import free_port

    settings.TUNEPLANE_JOIN_RATE = "5/minute"
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{free_port()}/0",
        }
    }
    burst = f"2001:db8::{uuid.uuid4().hex[:4]}:9"
    statuses = [
        anon_api.post("/api/nodes/join", join_body("tpj_guess"), REMOTE_ADDR=burst).status_code
        for _ in range(9)
    ]
    assert statuses.count(403) == 5 and statuses.count(429) == 4


def test_node_list_is_admin_only_and_query_count_is_flat(
    anon_api, admin_api, member_api, node_fleet, mint, django_assert_max_num_queries
):
    assert member_api.get("/api/nodes").status_code == 403
    for _ in range(3):
        anon_api.post("/api/nodes/join", join_body(mint(node_fleet)[1]))
    admin_api.get("/api/nodes")
    with django_assert_max_num_queries(8):
        assert admin_api.get("/api/nodes").json()["count"] == 3
    for _ in range(10):
        anon_api.post("/api/nodes/join", join_body(mint(node_fleet)[1]))
    with django_assert_max_num_queries(8):
        assert admin_api.get("/api/nodes").json()["count"] == 13


def test_ca_is_kept_private(console_pki):
    assert oct((console_pki / "ca.key").stat().st_mode & 0o777) == "0o600"
    assert (
        pki.load_ca().cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        is True
    )
