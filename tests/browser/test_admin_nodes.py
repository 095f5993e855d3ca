"""The Fleet page shows connection, scheduling and inventory apart (L7); an operator cordons a
node through the admin action — in Debian's Chromium. Screenshots go to var/artifacts/."""

from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone
from playwright.sync_api import expect

from nodes.choices import SchedulingState
from nodes.models import CardAlias, HardwareSeries, Node, NodeCordon, NodeCredential
from nodes.services.control import node_report_inventory
from nodes.services.join import node_join
from nodes.services.sessions import session_open
from tests.conftest import H100_INVENTORY, make_csr

from .test_admin_fleet_page import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ARTIFACTS = Path(settings.BASE_DIR) / "var" / "artifacts"


def joined(fleet, mint, hostname, inventory=H100_INVENTORY):
    result = node_join(
        token=mint(fleet)[1],
        fleet_id=fleet.id,
        csr=make_csr()[1],
        inventory=inventory,
        hostname=hostname,
    )
    return result.node, result.certificate.serial


def test_L7_fleet_page_groups_and_cordon_action(page, live_server, admin_user, make_fleet, mint):
    fleet = make_fleet("gpu-lab", kind="node", capabilities=["train", "serve"])
    h100, _ = HardwareSeries.objects.get_or_create(slug="h100", defaults={"name": "H100"})
    CardAlias.objects.update_or_create(name="NVIDIA H100 80GB HBM3", defaults={"series": h100})
    live, serial = joined(fleet, mint, "gpu-live")
    session_open(node_id=live.id, serial=serial, gateway="gw-1:8443")
    node_report_inventory(node_id=live.id, inventory=H100_INVENTORY)
    gone, _ = joined(
        fleet,
        mint,
        "gpu-gone",
        inventory={
            "cards": [{"name": "Mystery Accelerator 9000", "count": 2}],
            "storage_root_visible": False,
        },
    )
    Node.objects.filter(pk=gone.id).update(
        scheduling_state=SchedulingState.GONE,
        quiet_train=True,
        quiet_serve=True,
        last_seen_at=timezone.now() - timedelta(minutes=10),
    )

    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/admin/fleets/fleet/gpu-lab/change/")
    connection, scheduling, inventory = (
        page.locator(f"#group-{name}") for name in ("connection", "scheduling", "inventory")
    )
    for group, title in (
        (connection, "Control connection"),
        (scheduling, "Scheduling"),
        (inventory, "Inventory"),
    ):
        expect(group.locator("h2")).to_have_text(title)

    def row(group, node):
        return group.locator(f"tr[data-node='{node.id}']")

    expect(row(connection, live).locator(".connection-state")).to_have_text("connected")
    expect(row(connection, live)).to_contain_text("gw-1:8443")
    expect(row(connection, gone).locator(".connection-state")).to_have_text("disconnected")
    expect(row(connection, gone).locator(".heartbeat-age")).to_have_text("10m ago")
    expect(row(scheduling, live).locator(".scheduling-state")).to_have_text("schedulable")
    expect(row(scheduling, gone).locator(".scheduling-state")).to_have_text("gone")
    expect(row(scheduling, live).locator(".liveness-serve")).to_have_text("ok")
    expect(row(scheduling, gone).locator(".liveness-serve")).to_have_text("quiet")
    expect(row(inventory, live).locator(".cards")).to_contain_text("8 × NVIDIA H100 80GB HBM3")
    expect(row(inventory, live).locator(".cards")).to_contain_text("h100")
    expect(row(inventory, gone).locator(".cards")).to_contain_text("unmapped")
    expect(row(inventory, gone)).to_contain_text("not visible")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "fleet-page.png"), full_page=True)

    page.goto(f"{live_server.url}/admin/nodes/node/?fleet__id__exact=gpu-lab")
    page.check(f"#result_list input[name=_selected_action][value={live.id}]")
    page.select_option("select[name=action]", "cordon")
    page.click("button[name=index]")
    expect(page.locator("#id_reason")).to_have_attribute("required", "")  # a reason, always
    assert not NodeCordon.objects.exists()
    page.fill("#id_reason", "replacing a PSU")
    page.click("input[type=submit]")
    expect(page.locator(".messagelist .success")).to_contain_text("Nothing that runs was stopped")
    expect(page.locator("#result_list tbody tr", has_text="gpu-live")).to_contain_text(
        "cordoned (operator: replacing a PSU)"
    )

    page.goto(f"{live_server.url}/admin/fleets/fleet/gpu-lab/change/")
    expect(row(scheduling, live).locator(".scheduling-state")).to_have_text("cordoned")
    expect(row(scheduling, live).locator(".cordons")).to_contain_text("operator: replacing a PSU")
    expect(row(connection, live).locator(".connection-state")).to_have_text("connected")
    page.screenshot(path=str(ARTIFACTS / "fleet-page-cordoned.png"), full_page=True)


def test_D3_remove_action_lists_what_a_gone_node_leaves_behind(
    page, live_server, admin_user, make_fleet, mint
):
    from nodes.services.commands import Reported, node_command_create, node_command_report
    from tests.conftest import SYSTEM

    fleet = make_fleet("gpu-lab", kind="node", capabilities=["train"])
    gone, _ = joined(fleet, mint, "gpu-gone")
    command = node_command_create(
        actor=SYSTEM, node=gone, kind="run", payload={"argv": ["sleep", "600"]}
    )
    node_command_report(node_id=gone.id, reported=Reported(command.id, "running"))
    Node.objects.filter(pk=gone.id).update(scheduling_state=SchedulingState.GONE)

    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/admin/nodes/node/")
    page.check(f"#result_list input[name=_selected_action][value={gone.id}]")
    page.select_option("select[name=action]", "remove")
    page.click("button[name=index]")
    expect(page.locator(f"#removal-rows tr[data-node='{gone.id}'] .left-behind")).to_have_text(
        command.id
    )
    page.screenshot(path=str(ARTIFACTS / "remove-confirmation.png"), full_page=True)
    page.click("input[type=submit]")  # without force: refused, D3
    expect(page.locator(".messagelist .error")).to_contain_text("rule D3")
    assert Node.objects.get(pk=gone.id).scheduling_state == SchedulingState.GONE

    page.select_option("select[name=action]", "remove")
    page.check(f"#result_list input[name=_selected_action][value={gone.id}]")
    page.click("button[name=index]")
    page.check("#id_force")
    page.click("input[type=submit]")
    expect(page.locator(".messagelist .success")).to_contain_text("Remove:")
    assert Node.objects.get(pk=gone.id).scheduling_state == SchedulingState.REMOVED
    assert not NodeCredential.objects.filter(node=gone, revoked_at__isnull=True).exists()


def test_D1_a_fleets_machines_drain_with_one_reason_and_the_page_shows_progress(
    page, live_server, admin_user, make_fleet, mint
):
    from nodes.services.commands import Reported, node_command_create, node_command_report
    from tests.conftest import SYSTEM

    fleet = make_fleet("gpu-lab", kind="node", capabilities=["train"])
    busy, _ = joined(fleet, mint, "gpu-busy")
    joined(fleet, mint, "gpu-idle")
    command = node_command_create(
        actor=SYSTEM, node=busy, kind="run", payload={"argv": ["sleep", "600"]}
    )
    node_command_report(node_id=busy.id, reported=Reported(command.id, "running"))

    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/admin/fleets/fleet/")
    page.check("#result_list input[name=_selected_action][value=gpu-lab]")
    page.select_option("select[name=action]", "drain_machines")
    page.click("button[name=index]")
    expect(page.locator("#id_reason")).to_have_attribute("required", "")
    page.fill("#id_reason", "moving to rack 7")
    page.fill("#id_deadline", "2999-01-01 12:00")
    page.click("input[type=submit]")
    expect(page.locator(".messagelist .success")).to_contain_text(
        "2 machine(s) draining or drained"
    )

    page.goto(f"{live_server.url}/admin/fleets/fleet/gpu-lab/change/")
    expect(page.locator("#drain-progress")).to_contain_text("1 of 2 machine(s) drained")
    expect(page.locator("#drain-progress")).to_contain_text(
        "still to finish on them: 1 command run through the node API"
    )
    drain = page.locator(f"#group-scheduling tr[data-node='{busy.id}'] .drain")
    expect(drain).to_contain_text("moving to rack 7")
    expect(drain).to_contain_text("by 2999-01-01 12:00")
    expect(drain).to_contain_text("still to finish: 1 command run through the node API")
    page.screenshot(path=str(ARTIFACTS / "fleet-page-draining.png"), full_page=True)
