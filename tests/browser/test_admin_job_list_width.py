"""The training-job list fits an operator's 1,400 px window (issue 49): with the rows a busy
Fleet shows — a job running, jobs waiting with their reasons and positions (Q8), one preempting
— the page never scrolls sideways. Measured in Debian's Chromium; a screenshot goes to
var/artifacts/."""

from pathlib import Path

import pytest
from django.conf import settings
from playwright.sync_api import expect

from placement.services.allocator import allocate
from placement.services.quotas import QuotaSpec, quotas_replace
from tests.conftest import SYSTEM
from tests.placement.test_quotas import submit
from tests.placement.test_running_rules import members_of, report

from .test_admin_fleet_page import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ARTIFACTS = Path(settings.BASE_DIR) / "var" / "artifacts"
WINDOW = 1400


def page_width(page) -> int:
    return page.evaluate("document.scrollingElement.scrollWidth")


def results_overflow(page) -> int:
    """How far the list's table overflows its box: Django's admin scrolls a wide table inside
    its own box, so a page that fits can still hide columns behind a sideways scroll."""
    return page.evaluate(
        "(() => { const box = document.querySelector('#changelist .results');"
        " return box.scrollWidth - box.clientWidth; })()"
    )


def test_the_training_job_list_fits_a_1400_px_window(
    page, live_server, admin_user, node_fleet, gpu_node, member, vision
):
    gpu_node(node_fleet)
    quotas_replace(actor=SYSTEM, fleet=node_fleet, specs=[QuotaSpec("cv", guaranteed=8)])
    running = submit(member, "ml", "llama-3-8b-finetune-instruct-v2", cards=8, series="h100")
    allocate(fleet_id=node_fleet.id)
    for one in members_of(running):
        report(one)
    submit(member, "ml", "mistral-7b-continued-pretraining-long-context", cards=8)
    submit(vision, "cv", "vit-huge-imagenet-22k-sweep-lr-3e-4", cards=4)
    submit(member, "ml", "evaluation-harness-nightly", cards=2)
    allocate(fleet_id=node_fleet.id)

    page.set_viewport_size({"width": WINDOW, "height": 900})
    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/admin/placement/trainingjob/")
    expect(page.locator("#result_list tbody tr")).to_have_count(4)
    expect(page.locator("#result_list tbody tr", has_text="mistral")).to_contain_text("#")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "admin-training-jobs-1400.png"), full_page=True)
    assert page_width(page) <= WINDOW, f"the page is {page_width(page)} px wide"
    assert results_overflow(page) <= 0, f"the list scrolls {results_overflow(page)} px sideways"
