"""An administrator reads, in a real browser (Debian's Chromium), why a shared Fleet's work
waits and what preemption did (DESIGN §8 Q6–Q8): the job list's reasons to wait, a victim's
last preemption on its page, and a job's output framed on its page."""

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from placement.models import Attempt
from placement.services.allocator import allocate
from placement.services.quotas import QuotaSpec, quotas_replace
from tests.conftest import SYSTEM
from tests.placement.test_quotas import submit
from tests.placement.test_running_rules import members_of, report

from .test_admin_fleet_page import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_Q6_Q8_the_admin_shows_why_work_waits_and_whom_preemption_stopped(
    page, live_server, admin_user, node_fleet, gpu_node, member, vision
):
    gpu_node(node_fleet)
    quotas_replace(actor=SYSTEM, fleet=node_fleet, specs=[QuotaSpec("cv", guaranteed=8)])
    victim = submit(member, "ml", "borrower", cards=8)
    allocate(fleet_id=node_fleet.id)
    [one] = members_of(victim)
    report(one)
    Attempt.objects.filter(training_job=victim).update(
        started_at=timezone.now() - timedelta(hours=1)
    )
    owner = submit(vision, "cv", "owner", cards=8)
    assert allocate(fleet_id=node_fleet.id)["preempted"] == 1

    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/admin/placement/trainingjob/")
    waiting = page.locator("#result_list tbody tr", has_text="owner")
    expect(waiting).to_contain_text(
        f"preempting: preempting 1 job(s) for its cards: trainingjob-{victim.pk}"
    )
    expect(page.locator("#result_list tbody tr", has_text="borrower")).to_contain_text("preempting")

    page.goto(f"{live_server.url}/admin/placement/trainingjob/{victim.pk}/change/")
    expect(page.locator(".field-preempted .readonly")).to_contain_text(
        f"for trainingjob-{owner.pk}: project cv waits for cards within its guarantee"
    )
    page.goto(f"{live_server.url}/admin/placement/trainingjob/{owner.pk}/change/")
    frame = page.frame_locator("iframe[title=output]")
    expect(frame.locator("#output-said")).to_contain_text("the job has no attempt yet")
