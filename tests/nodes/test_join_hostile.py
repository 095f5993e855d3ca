"""Issue 17: what a joining machine, or anyone who can reach /api/nodes/join, learns and
costs — items 3 (no other Fleet's node ids), 5 (refusals audited at a bounded rate) and 7
(log lines carry values escaped)."""

import ipaddress
import logging
import uuid

from django.core.cache import cache

from audit.models import AuditEvent
from tests.conftest import H100_DEVICE_INVENTORY, make_csr
from tuneplane import windows
from tuneplane.client_address import parse_trusted_proxies
from tuneplane.logs import OneLineFormatter, escape


def join_body(secret, fleet="gpu-lab", **extra):
    return {
        "fleet": fleet,
        "token": secret,
        "csr": make_csr()[1],
        "address": "10.0.0.7:9100",
        "hostname": "gpu-01",
        "inventory": H100_DEVICE_INVENTORY,
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
    """The throttle counts in a cache that outlives one test run. Written as the console
    writes an address (ipaddress's form: "2001:db8::ae8:0", never "…::0ae8:0"): one in
    sixteen random ones began with a 0 and was then recorded under another spelling."""
    return str(ipaddress.ip_address(f"2001:db8::{uuid.uuid4().hex[:4]}:{n}"))


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


def test_issue17_item5_refused_joins_write_one_audit_event_and_one_line_a_minute_counted(
    anon_api, node_fleet, make_fleet, mint, caplog
):
    client = fresh_address()
    _, foreign = mint(make_fleet("otherlab"))

    def refuse(n, token="tpj_guess"):
        for _ in range(n):
            response = anon_api.post("/api/nodes/join", join_body(token), REMOTE_ADDR=client)
            assert response.status_code == 403

    refused = AuditEvent.objects.filter(action="node.join_refused").order_by("id")
    with caplog.at_level(logging.WARNING, logger="tuneplane.nodes"):
        refuse(100)  # within the minute's window, however slowly this machine answers
        refuse(3, token=foreign)  # another reason: an event of its own
        assert [(e.after["reason"], e.after["count"]) for e in refused] == [
            ("unknown token", 1),
            ("token is for another Fleet", 1),
        ]
        # The window ends (its key expires in the shared cache): the next refusal counts
        # every one since the last recorded.
        cache.delete(windows._key("join-refused", (client, "unknown token")) + ":open")
        refuse(1)
    assert [e.after["count"] for e in refused.filter(after__reason="unknown token")] == [1, 100]
    lines = [r for r in caplog.records if r.getMessage().startswith("join refused")]
    assert len(lines) == 3 and "100 since the last" in lines[-1].getMessage()


FORGED = "gpu-lab\n2026-12-04 08:00:00 INFO tuneplane.nodes node n-1 joined fleet gpu-lab"


def test_issue17_item7_a_newline_in_the_fleet_never_forges_a_log_line(anon_api, node_fleet, caplog):
    with caplog.at_level(logging.WARNING, logger="tuneplane.nodes"):
        response = anon_api.post("/api/nodes/join", join_body("tpj_guess", fleet=FORGED[:63]))
    assert response.status_code == 403
    lines = [r.getMessage() for r in caplog.records if r.name == "tuneplane.nodes"]
    assert lines and all("\n" not in line for line in lines)
    assert any("\\n2026-12-04" in line for line in lines)


def test_issue17_item7_the_configured_formatter_keeps_any_message_on_one_line(settings):
    console = next(h for h in logging.getLogger().handlers if h.name == "console")
    configured = console.formatter  # the LOGGING setting's
    record = logging.LogRecord("tuneplane", logging.INFO, __file__, 1, "%s", (FORGED,), None)
    assert isinstance(configured, OneLineFormatter)
    assert "\n" not in configured.format(record)
    assert escape("a\u2028b\x1b[31mc\rd") == "a\\u2028b\\x1b[31mc\\rd"
