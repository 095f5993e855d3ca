"""An administrator registers and drains a Fleet in a real browser (Debian's Chromium)."""

import re

import pytest
from playwright.sync_api import expect

from audit.models import AuditEvent
from fleets.models import Fleet

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def log_in(page, base):
    page.goto(f"{base}/admin/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "ops-password-1")
    page.click("input[type=submit]")
    expect(page.locator("#site-name")).to_contain_text("Tuneplane console")


def test_new_fleet_then_drain_it(page, live_server, admin_user, tmp_path):
    base = live_server.url
    log_in(page, base)
    page.click("#content-main a[href='/admin/fleets/fleet/']")
    page.click("text=New fleet")
    expect(page.locator("h1")).to_have_text("New fleet")

    page.fill("#id_id", "gpu-lab")
    page.select_option("#id_kind", "node")
    page.check("input[name=capabilities][value=train]")
    page.check("input[name=capabilities][value=serve]")
    expect(page.locator("#id_delivery")).to_have_value("")  # follows the kind (F2)
    page.fill("#id_config", '{"storag_root": "/mnt/shared"}')
    page.click("input[name=_save]")

    warning = page.locator(".messagelist .warning")
    expect(warning).to_contain_text("storag_root")  # F4: saved, and said so
    expect(warning).to_contain_text("Did you mean 'storage_root'")
    row = page.locator("#result_list tbody tr", has_text="gpu-lab")
    expect(row).to_contain_text("shared-mount")
    expect(row).to_contain_text("serve, train")
    page.screenshot(path=str(tmp_path / "fleet-list.png"), full_page=True)

    page.click("#result_list >> text=gpu-lab")
    expect(page.locator("select[name=kind]")).to_have_count(0)  # F1: read-only
    expect(page.locator("select[name=delivery]")).to_have_count(0)
    expect(page.locator(".field-kind .readonly")).to_have_text("node")
    expect(page.locator(".field-delivery .readonly")).to_have_text("shared-mount")

    page.goto(f"{base}/admin/fleets/fleet/")
    page.check("#result_list input[name=_selected_action][value=gpu-lab]")
    page.select_option("select[name=action]", "drain")
    page.click("button[name=index]")
    expect(page.locator(".messagelist .success")).to_contain_text(
        re.compile("Now draining: gpu-lab. Running work continues")
    )

    fleet = Fleet.objects.get(pk="gpu-lab")
    assert (fleet.delivery, fleet.state, fleet.capabilities) == (
        "shared-mount",
        "draining",
        ["serve", "train"],
    )
    actions = list(
        AuditEvent.objects.filter(target_id="gpu-lab")
        .order_by("at")
        .values_list("action", "actor_label")
    )
    assert actions == [("fleet.created", "ops"), ("fleet.state_changed", "ops")]


def test_add_a_machine_shows_the_one_liner_once_with_a_copy_button(
    page, live_server, admin_user, make_fleet, settings, tmp_path
):
    settings.TUNEPLANE_PUBLIC_URL = live_server.url
    make_fleet("gpu-lab", kind="node", capabilities=["train"])
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/admin/fleets/fleet/gpu-lab/change/")
    page.click("text=Add a machine")
    page.click("input[name=mint]")
    command = page.locator("#install-command")
    expect(command).to_contain_text("| TUNEPLANE_FLEET=gpu-lab TUNEPLANE_JOIN_TOKEN=tpj_")
    page.click("[data-copy=install-command]")
    expect(page.locator("[data-copy=install-command]")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == command.inner_text()
    page.screenshot(path=str(tmp_path / "add-machine.png"), full_page=True)
    secret = re.search(r"tpj_[A-Za-z0-9_-]+", command.inner_text()).group(0)
    page.reload()  # a reload re-asks; it never shows the old token again
    assert secret not in page.content()
