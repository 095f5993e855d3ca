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
        re.compile("Now draining: gpu-lab. Running work continues"))

    fleet = Fleet.objects.get(pk="gpu-lab")
    assert (fleet.delivery, fleet.state, fleet.capabilities) == (
        "shared-mount", "draining", ["serve", "train"])
    actions = list(AuditEvent.objects.filter(target_id="gpu-lab")
                   .order_by("at").values_list("action", "actor_label"))
    assert actions == [("fleet.created", "ops"), ("fleet.state_changed", "ops")]
