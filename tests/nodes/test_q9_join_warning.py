"""Q9 at join: an inventory that counts cards but lists no devices gets a join warning naming
the fix (each card by index and UUID, as tuneplane-node reports them), and the audit event of
the join names it; an inventory that lists its devices gets none. The agent prints it."""

import pytest

from audit.models import AuditEvent
from tests.conftest import H100_DEVICE_INVENTORY, H100_INVENTORY, make_csr

from .agent_process import agent, inventory_file, machine


def join(api, secret, inventory, address):
    return api.post(
        "/api/nodes/join",
        {
            "fleet": "gpu-lab",
            "token": secret,
            "csr": make_csr()[1],
            "address": address,
            "hostname": "gpu-01",
            "inventory": inventory,
        },
    )


def test_Q9_a_join_whose_inventory_lists_cards_without_devices_is_warned_with_the_fix(
    anon_api, node_fleet, mint
):
    response = join(anon_api, mint(node_fleet)[1], H100_INVENTORY, "10.0.0.7:9100")
    assert response.status_code == 201, response.content
    warned = [w for w in response.json()["warnings"] if w["code"] == "no_devices"]
    assert len(warned) == 1, response.json()["warnings"]
    message = warned[0]["message"]
    assert "counts 8 card(s) but lists no devices" in message
    assert '"devices"' in message and '"index"' in message and '"uuid"' in message
    assert "nvidia-smi" in message and "--inventory-file" in message and "Q9" in message
    joined = AuditEvent.objects.get(action="node.joined", target_id=response.json()["node_id"])
    assert "no_devices" in joined.after["warnings"]

    listed = join(anon_api, mint(node_fleet)[1], H100_DEVICE_INVENTORY, "10.0.0.8:9100")
    assert listed.status_code == 201, listed.content
    assert "no_devices" not in [w["code"] for w in listed.json()["warnings"]]


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_Q9_the_agent_joining_with_an_inventory_file_of_cards_alone_prints_the_warning(
    live_server, settings, node_fleet, mint, tmp_path
):
    """The user's way in (issue 38): `tuneplane-node join --inventory-file` of `cards` alone."""
    settings.TUNEPLANE_PUBLIC_URL = live_server.url
    joined = agent(
        "join",
        "--server",
        live_server.url,
        "--fleet",
        "gpu-lab",
        "--token",
        mint(node_fleet)[1],
        "--inventory-file",
        inventory_file(tmp_path, H100_INVENTORY),
        env=machine(tmp_path),
    )
    assert joined.returncode == 0, joined.stderr
    assert "warning: no_devices: The inventory counts 8 card(s) but lists no devices" in (
        joined.stdout
    )
