"""The real Slurm JWT, read from a file by one Fleet and from an environment variable by
another, and a token slurmrestd refuses: neither in any table, DEBUG log line, audit row,
answer or Fleet page. Fleets name where their token is, never the token itself.

The cluster is tests/slurm_cluster.py's; the same checks without Slurm, with Kubernetes and
with node and API secrets, are in tests/nodes/test_secrets.py.
"""

import pytest

from fleets.models import Fleet
from nodes.services.clusters import cluster_refresh
from tests.conftest import Api
from tests.nodes.test_secrets import (
    assert_appear_nowhere,
    audit_rows,
    dump_every_table,
    every_statement_logged,
    fake_jwt,
    fleet_page,
    logged_lines,
)

pytestmark = [pytest.mark.slurm]

TOKEN_ENV = "TUNEPLANE_TOKEN_TEST_SLURM_SECRETS_JWT"
REFUSED_TOKEN_ENV = "TUNEPLANE_TOKEN_TEST_SLURM_SECRETS_REFUSED_JWT"


def test_the_slurm_jwt_and_a_refused_token_appear_nowhere_after_reads(
    slurm_cluster, admin_user, admin_client, monkeypatch, tmp_path, secrets_dir, caplog
):
    refused_token = fake_jwt("signed-with-another-key")
    monkeypatch.setenv(TOKEN_ENV, slurm_cluster.token)
    monkeypatch.setenv(REFUSED_TOKEN_ENV, refused_token)
    token_file = secrets_dir / "slurm.jwt"
    token_file.write_text(f"SLURM_JWT={slurm_cluster.token}\n")  # as `scontrol token` prints it
    slurm = {
        "slurm_rest_url": slurm_cluster.url,
        "slurm_api_version": "v0.0.38",
        "slurm_partition": slurm_cluster.partition,
        "slurm_user": "root",
        "slurm_workdir": str(tmp_path),
    }
    token_sources = {
        "hpc-file": {"slurm_token_file": str(token_file)},
        "hpc-env": {"slurm_token_env": TOKEN_ENV},
        "hpc-refused": {"slurm_token_env": REFUSED_TOKEN_ENV},
    }
    admin = Api(admin_user)
    with every_statement_logged(caplog):
        created = [
            admin.post(
                "/api/fleets",
                {
                    "id": fleet_id,
                    "kind": "slurm",
                    "capabilities": ["train"],
                    "config": {**slurm, **source},
                },
            )
            for fleet_id, source in token_sources.items()
        ]
        read = {
            fleet_id: cluster_refresh(Fleet.objects.get(pk=fleet_id)) for fleet_id in token_sources
        }
        shown = [admin.get(f"/api/fleets/{fleet_id}") for fleet_id in token_sources]
        pages = {fleet_id: fleet_page(admin_client, fleet_id) for fleet_id in token_sources}

    assert [answer.status_code for answer in created] == [201, 201, 201]
    for fleet_id in ("hpc-file", "hpc-env"):
        assert read[fleet_id].error == ""
        assert [m["name"] for m in read[fleet_id].machines] == [slurm_cluster.node_name]
    assert "500" in read["hpc-refused"].error and "unreachable" in pages["hpc-refused"]
    places = {
        "tables": dump_every_table(),
        "logs": logged_lines(caplog),
        "audit": audit_rows(),
        "answers": "\n".join(answer.content.decode() for answer in [*created, *shown]),
        "Fleet pages": "\n".join(pages.values()),
    }
    assert "INSERT" in places["logs"]  # the SQL log really was captured
    assert_appear_nowhere(
        {"Slurm JWT": slurm_cluster.token, "refused token": refused_token}, places
    )
