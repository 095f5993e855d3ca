"""A Fleet page's drain says what it still waits for in an operator's words (D1, issue 49):
not "work left: 2 start" (a command kind) but the running members it waits for, and that
nothing is stopped — in Debian's Chromium."""

import pytest
from playwright.sync_api import expect

from nodes.services.drains import fleet_nodes_drain
from placement.services.allocator import allocate
from tests.conftest import SYSTEM
from tests.placement.test_quotas import submit
from tests.placement.test_running_rules import members_of, report

from .test_admin_fleet_page import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_D1_the_fleet_page_says_a_drain_waits_for_two_running_members(
    page, live_server, admin_user, node_fleet, gpu_node, member
):
    node = gpu_node(node_fleet)
    first = submit(member, "ml", "first", cards=4)
    second = submit(member, "ml", "second", cards=4)
    allocate(fleet_id=node_fleet.id)
    for job in (first, second):
        [one] = members_of(job)
        report(one)
    fleet_nodes_drain(actor=SYSTEM, fleet=node_fleet, reason="moving to rack 7")

    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/admin/fleets/fleet/{node_fleet.id}/change/")
    progress = page.locator("#drain-progress")
    expect(progress).to_contain_text(
        "still to finish on them: 2 running job, deployment or session members."
    )
    expect(progress).to_contain_text("Nothing is stopped (D1): a machine is drained once its")
    expect(progress).not_to_contain_text("start")
    drain = page.locator(f"#group-scheduling tr[data-node='{node.id}'] .drain")
    expect(drain).to_contain_text("still to finish: 2 running job, deployment or session members")
