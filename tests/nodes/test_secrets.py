"""No join token, API token or private key in any table, log line, audit row or error body."""

import logging

from django.db import connection

from audit.models import AuditEvent
from tests.conftest import H100_INVENTORY, Api, make_csr


def dump_every_table() -> str:
    rows = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f'SELECT * FROM "{table}"')
            rows.extend(str(row) for row in cursor.fetchall())
    return "\n".join(rows)


def test_secrets_appear_nowhere_after_a_full_scenario(admin_user, node_fleet, caplog,
                                                      console_pki):
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="django.db.backends")
    connection.force_debug_cursor = True  # every SQL statement is logged, parameters included
    try:
        admin = Api(admin_user)
        api_secret = admin.client._credentials["HTTP_AUTHORIZATION"].split()[1]
        minted = admin.post("/api/fleets/gpu-lab/join-tokens").json()
        join_secret = minted["token"]
        key_pem, csr = make_csr()
        body = {"fleet": "gpu-lab", "token": join_secret, "csr": csr, "inventory": H100_INVENTORY}
        joined = Api().post("/api/nodes/join", body)
        assert joined.status_code == 201
        refused = Api().post("/api/nodes/join", body)  # the same token again
        errors = [refused.content.decode(),
                  admin.post("/api/fleets/nope/join-tokens").content.decode()]
    finally:
        connection.force_debug_cursor = False

    node_key = "".join(key_pem.decode().splitlines()[1:-1])
    ca_key = "".join((console_pki / "ca.key").read_text().splitlines()[1:-1])
    secrets = {"API token": api_secret, "join token": join_secret, "node key": node_key,
               "CA key": ca_key}
    places = {
        "tables": dump_every_table(),
        "logs": "\n".join(f"{r.getMessage()} {r.args}" for r in caplog.records),
        "audit": "\n".join(str((e.before, e.after)) for e in AuditEvent.objects.all()),
        "error bodies": "\n".join(errors),
    }
    assert "INSERT" in places["logs"]  # the SQL log really was captured
    for secret_name, secret in secrets.items():
        for place, text in places.items():
            assert secret not in text, f"{secret_name} found in {place}"
            assert secret[-16:] not in text, f"part of the {secret_name} found in {place}"
