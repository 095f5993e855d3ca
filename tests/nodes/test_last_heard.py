"""When was a node last heard: kept on the node after its stream ends — the last heard time
and how its last session ended — in the API and on the Fleet page (L7)."""

import re

from nodes.models import Node
from nodes.services.control import leases_renew
from nodes.services.drains import node_drain
from nodes.services.join import node_join
from nodes.services.removal import node_remove
from nodes.services.sessions import session_close, session_open
from tests.conftest import H100_INVENTORY, SYSTEM, make_csr


def connected(fleet, mint):
    joined = node_join(
        token=mint(fleet)[1], fleet_id=fleet.id, csr=make_csr()[1], inventory=H100_INVENTORY
    )
    return session_open(node_id=joined.node.id, serial=joined.certificate.serial, gateway="gw-1")


def test_L7_a_disconnected_node_says_when_it_was_last_heard_and_why_its_session_ended(
    admin_api, node_fleet, mint
):
    session = connected(node_fleet, mint)
    heard = session.opened_at.replace(microsecond=0)
    leases_renew({str(session.id): heard})
    shown = admin_api.get(f"/api/nodes/{session.node_id}").json()["connection"]
    assert shown["state"] == "connected" and shown["last_session_closed_at"] is None
    session_close(session_id=session.id, reason="stream ended: connection reset")
    shown = admin_api.get(f"/api/nodes/{session.node_id}").json()["connection"]
    assert shown["state"] == "disconnected" and shown["last_heartbeat_at"] is None
    assert shown["last_heard_at"].startswith(heard.strftime("%Y-%m-%dT%H:%M:%S"))
    assert shown["last_session_close_reason"] == "stream ended: connection reset"
    node = Node.objects.get(pk=session.node_id)
    assert node.last_session_closed_at is not None and node.last_seen_at == heard


def test_L7_the_fleet_page_shows_the_last_heard_time_of_a_disconnected_node(
    client, admin_user, node_fleet, mint
):
    session = connected(node_fleet, mint)
    session_close(session_id=session.id, reason="replaced by a newer stream")
    client.force_login(admin_user)
    page = client.get(f"/admin/fleets/fleet/{node_fleet.pk}/change/").content.decode()
    row = re.search(r'<div class="module" id="group-connection">.*?</table>', page, re.S).group(0)
    assert "last heard" in row and "replaced by a newer stream" in row


def test_D4_removal_ends_the_session_and_says_so_on_the_node(node_fleet, mint):
    session = connected(node_fleet, mint)
    node = Node.objects.get(pk=session.node_id)
    node_remove(actor=SYSTEM, node=node_drain(actor=SYSTEM, node=node, reason="leaving"))
    node.refresh_from_db()
    assert node.last_session_close_reason == "node removed" and node.last_session_closed_at


def test_L7_the_node_list_says_when_a_disconnected_node_was_last_heard(
    client, admin_user, node_fleet, mint
):
    session = connected(node_fleet, mint)
    session_close(session_id=session.id, reason="stream ended: deadline exceeded")
    client.force_login(admin_user)
    listed = client.get("/admin/nodes/node/").content.decode()
    cell = re.search(r'<td class="field-connection">(.*?)</td>', listed, re.S).group(1)
    assert "disconnected" in cell and "last heard" in cell
    assert "stream ended: deadline exceeded" in cell
