"""Issue 17: what a joining machine, or anyone who can reach /api/nodes/join, learns and
costs — items 3 (no other Fleet's node ids), 5 (refusals audited at a bounded rate) and 7
(log lines carry values escaped)."""

from tests.conftest import H100_INVENTORY, make_csr


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
