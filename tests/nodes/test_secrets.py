"""No join token, API token, private key or cluster token (JWT) in any table, log line, audit
row, error body or Fleet page, after a full scenario: a node joins and rotates its key; used,
revoked and unknown join tokens are refused; an API token is revoked and presented again;
cluster Fleets read their JWT from an environment variable or a file, and are refused with it.

The cluster Fleets' answers are REPLAYED (tests/nodes/kube_replay.py: stored Kubernetes API
responses, a NodeList and a 401, and slurmrestd's refusals served from the same stand-in):
what is proved is where each token is read from, that it is sent, and where it never goes,
not how a real API server answers. The real-Slurm equivalent of the cluster part is
tests/slurm/test_slurm_secrets.py.
"""

import base64
import json
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from secrets import token_urlsafe

from django.db import connection
from rest_framework.test import APIClient

from audit.models import AuditEvent
from audit.services import Actor
from fleets.models import Fleet
from nodes.models import JoinToken, NodeCredential
from nodes.services.clusters import cluster_refresh
from nodes.services.control import credential_rotate
from tests.conftest import H100_INVENTORY, Api, make_csr
from tests.nodes.kube_replay import KubeReplay
from tuneplane.models import ApiToken
from tuneplane.services import api_token_create, api_token_revoke

KUBE_TOKEN_ENV = "TUNEPLANE_TOKEN_TEST_SECRETS_KUBE_TOKEN"
SLURM_TOKEN_ENV = "TUNEPLANE_TOKEN_TEST_SECRETS_SLURM_JWT"
SLURM_NODES = "/slurm/v0.0.38/nodes"
# How slurmrestd 22.05 answers a token it cannot verify.
SLURM_REFUSAL = {"errors": [{"error": "Unspecified error", "error_number": -1}]}
LOG_FORMAT = logging.Formatter("%(name)s %(levelname)s %(message)s")


def dump_every_table() -> str:
    rows = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f'SELECT * FROM "{table}"')
            rows.extend(str(row) for row in cursor.fetchall())
    return "\n".join(rows)


@contextmanager
def every_statement_logged(caplog):
    """DEBUG everywhere, and every SQL statement logged with its parameters."""
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="django.db.backends")
    connection.force_debug_cursor = True
    try:
        yield
    finally:
        connection.force_debug_cursor = False


def logged_lines(caplog) -> str:
    """Each record as a handler would write it (tracebacks included), and its raw arguments."""
    return "\n".join(f"{LOG_FORMAT.format(r)} {r.args}" for r in caplog.records)


def audit_rows() -> str:
    return "\n".join(str(row) for row in AuditEvent.objects.values_list())


def fleet_page(client, fleet_id: str) -> str:
    return client.get(f"/admin/fleets/fleet/{fleet_id}/change/").content.decode()


def fake_jwt(subject: str) -> str:
    """Shaped like a real one (header.payload.signature); its signature is this run's alone."""

    def encoded(claims: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()

    return ".".join(
        [encoded({"alg": "HS256", "typ": "JWT"}), encoded({"sub": subject}), token_urlsafe(32)]
    )


def pem_body(pem: bytes | str) -> str:
    text = pem.decode() if isinstance(pem, bytes) else pem
    return "".join(text.splitlines()[1:-1])


def assert_appear_nowhere(secrets: dict[str, str], places: dict[str, str]) -> None:
    """Neither a secret nor its last 16 characters (a truncated or re-wrapped copy)."""
    for secret_name, secret in secrets.items():
        for place, text in places.items():
            for fragment in (secret, secret[-16:]):
                at = text.find(fragment)
                around = text[max(at - 200, 0) : at + len(fragment) + 50]
                assert at < 0, f"{secret_name} found in {place}: …{around!r}…"


def bearer(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@dataclass
class Outcome:
    """What one part of the scenario handed out, and what its callers were answered."""

    secrets: dict[str, str] = field(default_factory=dict)
    answers: list[str] = field(default_factory=list)


def join_rotate_and_be_refused(admin: Api) -> Outcome:
    """A node joins, then rotates its key (J6: only a CSR travels, the key stays with the
    agent); a used, a revoked and an unknown join token are refused."""
    minted = admin.post("/api/fleets/gpu-lab/join-tokens").json()
    key_pem, csr = make_csr()
    body = {"fleet": "gpu-lab", "token": minted["token"], "csr": csr, "inventory": H100_INVENTORY}
    joined = Api().post("/api/nodes/join", body)
    assert joined.status_code == 201
    node_id = joined.json()["node_id"]
    new_key_pem, new_csr = make_csr()
    credential_rotate(
        node_id=node_id, csr=new_csr, serial=NodeCredential.objects.get(node_id=node_id).serial
    )
    assert NodeCredential.objects.filter(node_id=node_id).count() == 2

    revoked = admin.post("/api/fleets/gpu-lab/join-tokens").json()
    assert admin.delete(f"/api/join-tokens/{revoked['id']}").status_code == 200
    unknown = JoinToken.PREFIX + token_urlsafe(32)
    refused = [
        Api().post("/api/nodes/join", {**body, "token": token})
        for token in (minted["token"], revoked["token"], unknown)
    ]
    assert [answer.status_code for answer in refused] == [403, 403, 403]
    return Outcome(
        secrets={
            "used join token": minted["token"],
            "revoked join token": revoked["token"],
            "unknown join token": unknown,
            "node key": pem_body(key_pem),
            "node's rotated key": pem_body(new_key_pem),
        },
        answers=[answer.content.decode() for answer in refused],
    )


def revoke_and_present_an_api_token(admin_user) -> Outcome:
    """A token that worked, revoked and presented again; and one that never existed."""
    actor = Actor.of_user(admin_user)
    token, secret = api_token_create(actor=actor, user=admin_user, name="ci")
    assert bearer(secret).get("/api/fleets").status_code == 200
    api_token_revoke(actor=actor, token=token)
    unknown = ApiToken.PREFIX + token_urlsafe(32)
    refused = [bearer(presented).get("/api/fleets") for presented in (secret, unknown)]
    assert [answer.status_code for answer in refused] == [401, 401]
    return Outcome(
        secrets={"revoked API token": secret, "unknown API token": unknown},
        answers=[answer.content.decode() for answer in refused],
    )


def read_cluster_fleets(admin: Api, replay: KubeReplay, monkeypatch, secrets_dir) -> Outcome:
    """Fleets made through the API name where their JWT is; each is read once it works and
    once it is refused (401, 500), so the manager's refusal is stored and shown."""
    kube_jwt, env_jwt, file_jwt, pasted_jwt = (
        fake_jwt(subject)
        for subject in ("kube-reader", "slurm-env", "slurm-file", "pasted-into-the-config")
    )
    monkeypatch.setenv(KUBE_TOKEN_ENV, kube_jwt)
    monkeypatch.setenv(SLURM_TOKEN_ENV, env_jwt)
    token_file = secrets_dir / "slurm.jwt"
    token_file.write_text(f"SLURM_JWT={file_jwt}\n")  # as `scontrol token` prints it
    slurm = {
        "slurm_rest_url": replay.url,
        "slurm_api_version": "v0.0.38",
        "slurm_partition": "debug",
        "slurm_user": "root",
    }
    configs = {
        "k8s-lab": (
            "kubernetes",
            {
                "kube_api_url": replay.url,
                "kube_token_env": KUBE_TOKEN_ENV,
                "kuberay_namespace": "ml-jobs",
            },
        ),
        "hpc-env": ("slurm", {**slurm, "slurm_token_env": SLURM_TOKEN_ENV}),
        "hpc-file": ("slurm", {**slurm, "slurm_token_file": str(token_file)}),
    }
    created = [
        admin.post("/api/fleets", {"id": fleet_id, "kind": kind, "config": config})
        for fleet_id, (kind, config) in configs.items()
    ]
    assert [answer.status_code for answer in created] == [201, 201, 201]
    pasted = admin.post(
        "/api/fleets",
        {"id": "hpc-pasted", "kind": "slurm", "config": {**slurm, "slurm_token_env": pasted_jwt}},
    )
    assert pasted.json()["error"]["field"] == "config.slurm_token_env"

    kube = Fleet.objects.get(pk="k8s-lab")
    assert kube.config["kube_token_env"] == KUBE_TOKEN_ENV
    assert cluster_refresh(kube).error == ""
    replay.serve("GET", "/api/v1/nodes", "status-401.json", status=401)
    assert "authentication failed" in cluster_refresh(kube).error
    replay.serve("GET", SLURM_NODES, SLURM_REFUSAL, status=500)
    assert "500" in cluster_refresh(Fleet.objects.get(pk="hpc-env")).error
    replay.serve("GET", SLURM_NODES, {}, status=401)
    assert "401" in cluster_refresh(Fleet.objects.get(pk="hpc-file")).error
    sent = {
        r.headers.get("authorization") or r.headers["x-slurm-user-token"] for r in replay.requests
    }
    assert sent == {f"Bearer {kube_jwt}", env_jwt, file_jwt}  # each really was read and used

    shown = [admin.get(f"/api/fleets/{fleet_id}") for fleet_id in configs]
    return Outcome(
        secrets={
            "Kubernetes token (env)": kube_jwt,
            "Slurm JWT (env)": env_jwt,
            "Slurm JWT (file)": file_jwt,
            "JWT pasted as a name": pasted_jwt,
        },
        answers=[a.content.decode() for a in [*created, pasted, *shown]],
    )


def test_secrets_appear_nowhere_after_a_full_scenario(
    admin_user, node_fleet, console_pki, replay, admin_client, monkeypatch, secrets_dir, caplog
):
    admin = Api(admin_user)
    with every_statement_logged(caplog):
        outcomes = [
            join_rotate_and_be_refused(admin),
            revoke_and_present_an_api_token(admin_user),
            read_cluster_fleets(admin, replay, monkeypatch, secrets_dir),
        ]
        missing_fleet = admin.post("/api/fleets/nope/join-tokens").content.decode()
        pages = {fleet.id: fleet_page(admin_client, fleet.id) for fleet in Fleet.objects.all()}

    assert "authentication failed" in pages["k8s-lab"]  # the refusal is shown, its token not
    secrets = {
        "API token": admin.client._credentials["HTTP_AUTHORIZATION"].split()[1],
        "CA key": pem_body((console_pki / "ca.key").read_text()),
    }
    for outcome in outcomes:
        secrets.update(outcome.secrets)
    places = {
        "tables": dump_every_table(),
        "logs": logged_lines(caplog),
        "audit": audit_rows(),
        "answers": "\n".join([missing_fleet] + [a for o in outcomes for a in o.answers]),
        "Fleet pages": "\n".join(pages.values()),
    }
    assert "INSERT" in places["logs"]  # the SQL log really was captured
    assert_appear_nowhere(secrets, places)
