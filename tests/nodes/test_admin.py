"""The admin side of joining: Add a machine (shown once), tokens, nodes, card names."""

import re

import pytest

from audit.models import AuditEvent
from nodes.downloads import lock_sha256
from nodes.models import CardAlias, HardwareSeries, JoinToken
from tuneplane.models import hash_secret


@pytest.fixture
def staff(client, admin_user):
    client.force_login(admin_user)
    return client


def test_fleet_page_offers_add_a_machine_for_node_fleets_only(staff, node_fleet, make_fleet):
    make_fleet("slurm-lab", kind="slurm")
    node_page = staff.get("/admin/fleets/fleet/gpu-lab/change/").content.decode()
    assert (
        "Add a machine" in node_page and "/admin/nodes/jointoken/add-machine/gpu-lab/" in node_page
    )
    assert (
        "Add a machine" not in staff.get("/admin/fleets/fleet/slurm-lab/change/").content.decode()
    )
    refused = staff.post("/admin/nodes/jointoken/add-machine/slurm-lab/").content.decode()
    assert "cluster manager" in refused
    assert not JoinToken.objects.exists()


def test_J2_add_a_machine_shows_the_token_once(staff, node_fleet, settings):
    settings.TUNEPLANE_PUBLIC_URL = "https://tuneplane.corp"
    url = "/admin/nodes/jointoken/add-machine/gpu-lab/"
    before = staff.get(url)
    assert "Mint a join token" in before.content.decode() and not JoinToken.objects.exists()
    minted = staff.post(url)
    page = minted.content.decode()
    assert "no-store" in minted["Cache-Control"]
    secret = re.search(r"TUNEPLANE_JOIN_TOKEN=(tpj_[A-Za-z0-9_-]+) ", page).group(1)
    assert f"TUNEPLANE_AGENT_SHA256={lock_sha256()} sh" in page
    assert "curl -fsSL https://tuneplane.corp/install.sh | TUNEPLANE_FLEET=gpu-lab" in page
    assert (
        f"tuneplane-node join --server https://tuneplane.corp --fleet gpu-lab --token {secret}"
        in page
    )
    assert JoinToken.objects.get().digest == hash_secret(secret)
    # Revisiting, the token list and the token's own page never show it again.
    for again in (
        url,
        "/admin/nodes/jointoken/",
        f"/admin/nodes/jointoken/{JoinToken.objects.get().pk}/change/",
    ):
        assert secret not in staff.get(again).content.decode(), again
    assert AuditEvent.objects.filter(action="join_token.minted").count() == 1


def test_token_list_revoke_action(staff, node_fleet, mint):
    token, _ = mint(node_fleet)
    staff.post("/admin/nodes/jointoken/", {"action": "revoke", "_selected_action": [token.pk]})
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_an_invisible_or_missing_fleet_has_no_add_machine_page(staff):
    assert staff.get("/admin/nodes/jointoken/add-machine/nope/").status_code == 404


def test_J4_unmapped_card_is_mapped_from_the_list(staff, admin_user):
    CardAlias.objects.create(name="Mystery Accelerator X")
    series = HardwareSeries.objects.create(slug="mystery", name="Mystery")
    page = staff.get("/admin/nodes/cardalias/?mapped=no").content.decode()
    assert "Mystery Accelerator X" in page and "NVIDIA H100 80GB HBM3" not in page
    alias = CardAlias.objects.get(name="Mystery Accelerator X")
    form = {
        "form-TOTAL_FORMS": "1",
        "form-INITIAL_FORMS": "1",
        "form-0-id": alias.pk,
        "form-0-series": series.pk,
        "_save": "Save",
    }
    response = staff.post("/admin/nodes/cardalias/?mapped=no", form)
    assert response.status_code == 302, response.content.decode()[-1500:]
    alias.refresh_from_db()
    assert alias.series == series
    event = AuditEvent.objects.get(action="card_alias.mapped")
    assert event.after == {"series": "mystery", "nodes": 0} and event.actor_label == "ops"


def test_stray_and_node_command_lists_render(client, admin_user, node_fleet, mint):
    from nodes.services.commands import Reported, node_commands_reconcile
    from nodes.services.join import node_join
    from tests.conftest import H100_INVENTORY, make_csr

    node = node_join(
        token=mint(node_fleet)[1], fleet_id="gpu-lab", csr=make_csr()[1], inventory=H100_INVENTORY
    ).node
    node_commands_reconcile(node_id=node.id, reported=[Reported("c-by-hand", "running")])
    client.force_login(admin_user)
    page = client.get("/admin/nodes/straycommand/")
    assert page.status_code == 200 and b"c-by-hand" in page.content
    assert client.get("/admin/nodes/nodecommand/").status_code == 200


def test_item11_a_nodes_page_shows_how_many_strays_were_dropped(
    client, admin_user, node_fleet, mint
):
    from nodes.models import Node
    from nodes.services.join import node_join
    from tests.conftest import H100_INVENTORY, make_csr

    node = node_join(
        token=mint(node_fleet)[1], fleet_id="gpu-lab", csr=make_csr()[1], inventory=H100_INVENTORY
    ).node
    Node.objects.filter(pk=node.pk).update(strays_dropped=11_937)
    client.force_login(admin_user)
    page = client.get(f"/admin/nodes/node/{node.pk}/change/").content.decode()
    assert "Strays dropped" in page and "11937" in page


def test_J4_a_card_name_added_with_its_series_in_the_admin_is_followed_by_nodes(
    staff, admin_user, node_fleet, mint
):
    from nodes.services.join import node_join
    from tests.conftest import H100_INVENTORY, make_csr

    inventory = {**H100_INVENTORY, "cards": [{"name": "Hand Added X9", "count": 2}]}
    node = node_join(
        token=mint(node_fleet)[1], fleet_id="gpu-lab", csr=make_csr()[1], inventory=inventory
    ).node
    CardAlias.objects.filter(name="Hand Added X9").delete()  # as if never reported
    series = HardwareSeries.objects.create(slug="x9", name="X9")
    response = staff.post(
        "/admin/nodes/cardalias/add/", {"name": "Hand Added X9", "series": series.pk}
    )
    assert response.status_code == 302, response.content.decode()[-1500:]
    node.refresh_from_db()
    assert node.series_cards == {"x9": 2}
    assert AuditEvent.objects.filter(action="card_alias.mapped", after__series="x9").count() == 1
