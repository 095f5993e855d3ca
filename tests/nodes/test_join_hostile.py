"""Issue 17: what a joining machine, or anyone who can reach /api/nodes/join, learns and
costs — items 3 (no other Fleet's node ids), 5 (refusals audited at a bounded rate) and 7
(log lines carry values escaped)."""

import uuid

from audit.models import AuditEvent
from tests.conftest import H100_INVENTORY, make_csr
from tuneplane.client_address import parse_trusted_proxies


def join_body(secret, fleet="gpu-lab", **extra):
    return {
        "fleet": fleet,
        "token": secret,
        "csr": make_csr()[1],
        "address": "10.0.0.7:9100",
        "hostname": "gpu-01",
        "inventory": H100_INVENTORY,
        **extra,
    }


def test_issue17_item3_join_warnings_never_name_another_fleets_nodes(anon_api, make_fleet, mint):
    lab, other = make_fleet("gpu-lab"), make_fleet("otherlab")
    same = {"address": "10.0.0.7:9100", "fingerprint": "ab" * 32}
    theirs = anon_api.post("/api/nodes/join", join_body(mint(other)[1], "otherlab", **same))
    ours = anon_api.post("/api/nodes/join", join_body(mint(lab)[1], **same)).json()
    again = anon_api.post("/api/nodes/join", join_body(mint(lab)[1], **same))
    assert again.status_code == 201
    text = again.content.decode()
    assert theirs.json()["node_id"] not in text and "otherlab" not in text
    warnings = again.json()["warnings"]
    assert [(w["code"], w.get("node"), w.get("count")) for w in warnings] == [
        ("address_in_use", ours["node_id"], None),
        ("address_in_use", None, 1),
        ("same_machine", ours["node_id"], None),
        ("same_machine", None, 1),
    ]
    assert theirs.json()["node_id"] not in str(ours["warnings"])


def fresh_address(n=0) -> str:
    """The throttle counts in a cache that outlives one test run."""
    return f"2001:db8::{uuid.uuid4().hex[:4]}:{n}"


def test_issue17_item4_a_forged_forwarded_for_does_not_escape_the_join_throttle(
    anon_api, node_fleet, settings
):
    settings.TUNEPLANE_JOIN_RATE = "3/minute"
    peer = fresh_address()
    statuses = [
        anon_api.post(
            "/api/nodes/join",
            join_body("tpj_guess"),
            REMOTE_ADDR=peer,
            HTTP_X_FORWARDED_FOR=fresh_address(i),
        ).status_code
        for i in range(6)
    ]
    assert statuses == [403, 403, 403, 429, 429, 429]


def test_issue17_item4_behind_a_trusted_proxy_the_hop_it_appended_is_the_client(
    anon_api, node_fleet, settings
):
    settings.TUNEPLANE_JOIN_RATE = "3/minute"
    settings.TUNEPLANE_TRUSTED_PROXIES = parse_trusted_proxies("10.1.0.0/16, 192.0.2.7")
    client = fresh_address()

    def via_proxy(forwarded_for):
        return anon_api.post(
            "/api/nodes/join",
            join_body("tpj_guess"),
            REMOTE_ADDR="10.1.2.3",
            HTTP_X_FORWARDED_FOR=forwarded_for,
        ).status_code

    # The client forges a left-most hop each time; the proxies append the real address.
    statuses = [via_proxy(f"{fresh_address(i)}, {client}, 192.0.2.7") for i in range(5)]
    assert statuses == [403, 403, 403, 429, 429]
    assert via_proxy(fresh_address(9)) == 403  # another client, through the same proxy
    refused = AuditEvent.objects.filter(action="node.join_refused")
    assert refused.filter(after__client=client).exists()
