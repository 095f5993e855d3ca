"""Issue 17, items 12 and 13: what an enrolled node (or a joining machine) reports is hostile
input — its numbers are bounded, the card names it adds to the registry are rationed, and its
credential rotates at most once a minute, the old one dying once the new one is used."""

import json

import pytest
from django.utils import timezone

from nodes.models import CardAlias, NodeCredential
from nodes.services.control import RotationTooSoon, credential_rotate, node_report_inventory
from nodes.services.hardware import NEW_CARD_NAMES_PER_NODE_HOUR
from nodes.services.join import node_join
from nodes.services.sessions import SessionRefused, session_open
from tests.conftest import H100_INVENTORY, make_csr


@pytest.fixture
def node(node_fleet, mint):
    joined = node_join(
        token=mint(node_fleet)[1], fleet_id="gpu-lab", csr=make_csr()[1], inventory=H100_INVENTORY
    )
    session_open(node_id=joined.node.id, serial=joined.certificate.serial, gateway="test")
    return joined


@pytest.mark.parametrize(
    "field, inventory",
    [
        ("inventory.cpu_budget", {**H100_INVENTORY, "cpu_budget": 10**400}),
        ("inventory.memory_budget_bytes", {**H100_INVENTORY, "memory_budget_bytes": 10**400}),
        (
            "inventory.cards[0].count",
            {**H100_INVENTORY, "cards": [{"name": "X", "count": 10**400}]},
        ),
        ("inventory.cards[0].name", {**H100_INVENTORY, "cards": [{"name": "X" * 201, "count": 1}]}),
        (
            "inventory.cards",
            {**H100_INVENTORY, "cards": [{"name": f"C{i}", "count": 1} for i in range(17)]},
        ),
    ],
)
def test_issue17_item12_every_number_and_name_of_an_inventory_is_bounded(
    anon_api, node_fleet, mint, field, inventory
):
    body = {"fleet": "gpu-lab", "token": mint(node_fleet)[1], "csr": make_csr()[1]}
    response = anon_api.post("/api/nodes/join", json.dumps({**body, "inventory": inventory}))
    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == field


def test_issue17_item12_a_node_adds_a_bounded_number_of_card_names_an_hour(node):
    before = CardAlias.objects.count()
    for report in range(5):
        invented = [{"name": f"Fake GPU {report}-{i}", "count": 1} for i in range(16)]
        node_report_inventory(node_id=node.node.id, inventory={**H100_INVENTORY, "cards": invented})
    assert CardAlias.objects.count() - before == NEW_CARD_NAMES_PER_NODE_HOUR
    # Its reports are stored all the same: only the registry is rationed.
    node.node.refresh_from_db()
    assert node.node.inventory["cards"][0]["name"].startswith("Fake GPU 4-")


def csr_pem() -> str:
    return make_csr()[1]


def test_issue17_item13_a_node_rotates_at_most_once_a_minute(node):
    first = credential_rotate(node_id=node.node.id, serial=node.certificate.serial, csr=csr_pem())
    for serial in (first.serial, node.certificate.serial):
        with pytest.raises(RotationTooSoon) as refused:
            credential_rotate(node_id=node.node.id, serial=serial, csr=csr_pem())
        assert refused.value.status == 429
    assert NodeCredential.objects.filter(node=node.node).count() == 2
    # A minute on, it may again.
    NodeCredential.objects.filter(serial=first.serial).update(
        created_at=timezone.now() - timezone.timedelta(seconds=61)
    )
    credential_rotate(node_id=node.node.id, serial=first.serial, csr=csr_pem())


def test_issue17_item13_the_old_certificate_dies_once_its_successor_is_used_on_a_stream(node):
    old = node.certificate.serial
    new = credential_rotate(node_id=node.node.id, serial=old, csr=csr_pem())
    session_open(node_id=node.node.id, serial=old, gateway="test")  # not yet used: still valid
    session_open(node_id=node.node.id, serial=new.serial, gateway="test")
    assert NodeCredential.objects.get(serial=old).revoked_at is not None
    with pytest.raises(SessionRefused):
        session_open(node_id=node.node.id, serial=old, gateway="test")
    with pytest.raises(SessionRefused):
        credential_rotate(node_id=node.node.id, serial=old, csr=csr_pem())
