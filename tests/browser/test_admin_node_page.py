"""A node's admin page reads as an operator asks (issue 49) — its cards by index, UUID, series
and health; what runs there, for which job and project, since when; its cordons and drain with
their reasons; the verbs cordon, uncordon, drain, resume and remove as buttons, each through
the node list's action (its reason asked for, the same service, the same audit); and no flag
that is fine shown as a red cross — in Debian's Chromium. Screenshots go to var/artifacts/."""

from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone
from playwright.sync_api import expect

from audit.models import AuditEvent
from nodes.choices import SchedulingState
from nodes.models import Node, NodeCordon
from nodes.services.health import node_cards_health
from placement.services.allocator import allocate
from tests.conftest import H100_DEVICES
from tests.placement.test_quotas import submit
from tests.placement.test_running_rules import members_of, report

from .test_admin_fleet_page import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ARTIFACTS = Path(settings.BASE_DIR) / "var" / "artifacts"
RED_CROSS = "img[src$='icon-no.svg']"


def verb(page, name):
    return page.locator(f"#verb-{name}")


def verbs_audited(node) -> list[tuple[str, str]]:
    return list(
        AuditEvent.objects.filter(
            target_id=node.id,
            action__in=["node.cordoned", "node.uncordoned", "node.draining", "node.resumed"],
        )
        .order_by("id")
        .values_list("action", "actor_label")
    )


def test_the_node_page_shows_cards_work_cordons_and_the_verbs_as_buttons(
    page, live_server, admin_user, node_fleet, gpu_node, member
):
    node = gpu_node(node_fleet)
    sick = H100_DEVICES[7]
    node_cards_health(
        node_id=node.id,
        unhealthy={
            f"{sick['uuid']}-10.0.0.1:1": {
                "index": 7,
                "name": sick["name"],
                "reason": "XID 79: fallen off the bus",
                "since": timezone.now().isoformat(),
            }
        },
        healthy={},
    )
    job = submit(member, "ml", "llama-finetune", cards=4)
    allocate(fleet_id=node_fleet.id)
    [one] = members_of(job)
    report(one)

    log_in(page, live_server.url)
    node_url = f"{live_server.url}/admin/nodes/node/{node.id}/change/"
    page.goto(node_url)

    cards = page.locator("#node-cards tbody tr")
    expect(cards).to_have_count(8)
    expect(cards.nth(0).locator(".card-index")).to_have_text("0")
    expect(cards.nth(0).locator(".card-uuid")).to_have_text("GPU-00000-h100-fake-10.0.0.1:1")
    expect(cards.nth(0).locator(".card-series")).to_have_text("h100")
    expect(cards.nth(0).locator(".card-health")).to_have_text("healthy")
    expect(cards.nth(7).locator(".card-health")).to_contain_text(
        "quarantined XID 79: fallen off the bus"
    )

    runs = page.locator("#node-members tbody tr")
    expect(runs).to_have_count(1)
    expect(runs.locator(".runs-for")).to_have_text("training job llama-finetune: attempt 1, rank 0")
    expect(runs.locator(".project")).to_have_text("ml")
    expect(runs.locator(".member-cards")).to_have_text("0, 1, 2, 3")
    expect(runs.locator(".since")).to_contain_text(f"{timezone.now():%Y-}")

    # Quiet flags that are fine (False) read as words, never the admin's red cross.
    expect(page.locator(RED_CROSS)).to_have_count(0)
    expect(page.locator(".field-liveness_shown .readonly")).to_have_text("serve: ok, train: ok")
    expect(page.locator("#node-cordons")).to_contain_text("None: the node takes new work")

    # Offered now: cordon and drain; the others say why not.
    for name in ("cordon", "drain"):
        expect(verb(page, name)).to_be_enabled()
    for name, why in (
        ("uncordon", "no operator's cordon to lift"),
        ("resume", "no drain to undo"),
        ("remove", "drain it first: only a drained or gone node is removed (D2, D3)"),
    ):
        expect(verb(page, name)).to_be_disabled()
        expect(verb(page, name)).to_have_attribute("title", why)

    verb(page, "cordon").click()
    expect(page.locator("#id_reason")).to_have_attribute("required", "")
    page.fill("#id_reason", "fan replaced on Tuesday")
    page.click("input[type=submit]")
    expect(page).to_have_url(node_url)
    expect(page.locator(".messagelist .success")).to_contain_text("Cordon:")
    expect(page.locator("#node-state")).to_contain_text("cordoned")
    cordon = page.locator("#node-cordons tr.cordon[data-source=operator]")
    expect(cordon).to_contain_text("fan replaced on Tuesday")
    expect(cordon).to_contain_text("ops")

    verb(page, "drain").click()
    page.fill("#id_reason", "moving to rack 7")
    page.click("input[type=submit]")
    expect(page).to_have_url(node_url)
    drain = page.locator("#node-cordons tr.drain")
    expect(drain).to_contain_text("moving to rack 7")
    expect(drain).to_contain_text("still to finish: 1 running job, deployment or session member")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "admin-node-page.png"), full_page=True)

    verb(page, "resume").click()
    expect(page).to_have_url(node_url)
    expect(page.locator("#node-cordons tr.drain")).to_have_count(0)
    verb(page, "uncordon").click()
    expect(page).to_have_url(node_url)
    expect(page.locator("#node-cordons tr.cordon")).to_have_count(0)
    assert not NodeCordon.objects.filter(node=node).exists()
    assert Node.objects.get(pk=node.pk).scheduling_state == SchedulingState.SCHEDULABLE
    assert verbs_audited(node) == [
        ("node.cordoned", "ops"),
        ("node.draining", "ops"),
        ("node.resumed", "ops"),
        ("node.uncordoned", "ops"),
    ]
    # The audit log's forced column: an unforced change (the usual one) is no red cross.
    page.goto(f"{live_server.url}/admin/audit/auditevent/?target_id={node.id}")
    expect(page.locator("#result_list tbody tr", has_text="node.resumed")).to_have_count(1)
    expect(page.locator(RED_CROSS)).to_have_count(0)


def test_D2_an_idle_node_drained_and_removed_from_its_page(
    page, live_server, admin_user, node_fleet, gpu_node
):
    node = gpu_node(node_fleet)
    log_in(page, live_server.url)
    node_url = f"{live_server.url}/admin/nodes/node/{node.id}/change/"
    page.goto(node_url)
    verb(page, "drain").click()
    page.fill("#id_reason", "retired")
    page.click("input[type=submit]")
    expect(page.locator("#node-state")).to_contain_text("drained")
    expect(verb(page, "remove")).to_be_enabled()
    verb(page, "remove").click()
    expect(page.locator("#removal-rows")).to_contain_text("nothing")
    page.click("input[type=submit]")
    expect(page).to_have_url(node_url)
    expect(page.locator(".messagelist .success")).to_contain_text("Remove:")
    assert Node.objects.get(pk=node.pk).scheduling_state == SchedulingState.REMOVED
    assert AuditEvent.objects.filter(target_id=node.id, action="node.removed").exists()
    for name in ("cordon", "uncordon", "drain", "resume", "remove"):
        expect(verb(page, name)).to_be_disabled()


def test_a_verb_is_posted_never_fetched(client, admin_user, node_fleet, gpu_node):
    node = gpu_node(node_fleet)
    client.force_login(admin_user)
    assert client.get(f"/admin/nodes/node/{node.id}/verb/cordon/").status_code == 405
    assert client.post(f"/admin/nodes/node/{node.id}/verb/delete/").status_code == 404
    assert not NodeCordon.objects.filter(node=node).exists()
