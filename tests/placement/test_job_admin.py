"""The admin reads jobs as the API does (DESIGN §7): state, attempts with their members and
cards; Cancel through the service (R10); a node Fleet's page shows its queue and each node's
cards held and free (R7)."""

import pytest
from django.urls import reverse

from nodes.services.commands import Reported, node_command_report
from placement.models import Member, TrainingJob
from placement.services.allocator import allocate

from .test_allocator import job


@pytest.fixture
def staff(client, admin_user):
    client.force_login(admin_user)
    return client


@pytest.fixture
def lab(node_fleet, gpu_node):
    gpu_node(node_fleet)
    return node_fleet


def test_a_jobs_page_shows_its_attempts_members_and_cards(staff, lab, member):
    record = job(member, cards=2)
    allocate(fleet_id=lab.id)
    started = Member.objects.get()
    node_command_report(node_id=started.node_id, reported=Reported(started.command_id, "running"))
    page = staff.get(reverse("admin:placement_trainingjob_change", args=[record.pk]))
    text = page.content.decode()
    assert page.status_code == 200
    for card in started.cards:
        assert f"{card['index']} ({card['uuid']})" in text
    assert f"rank 0 on {started.node_id}: running" in text
    listing = staff.get(reverse("admin:placement_trainingjob_changelist")).content.decode()
    assert "running" in listing


def test_R10_the_cancel_action_goes_through_the_service(staff, lab, member):
    queued = job(member, "queued", cards=8)
    TrainingJob.objects.filter(pk=queued.pk).update(cards=9)  # never fits: stays queued
    running = job(member, "running", cards=1)
    allocate(fleet_id=lab.id)
    response = staff.post(
        reverse("admin:placement_trainingjob_changelist"),
        {"action": "cancel", "_selected_action": [queued.pk, running.pk]},
        follow=True,
    )
    assert response.status_code == 200
    assert TrainingJob.objects.get(pk=queued.pk).state == "cancelled"
    cancelling = TrainingJob.objects.get(pk=running.pk)
    assert cancelling.cancel_requested_at is not None and cancelling.state == "starting"


def test_R7_a_node_fleets_page_shows_its_queue_and_each_nodes_cards_held_and_free(
    staff, lab, member
):
    job(member, "a", cards=3)
    waiting = job(member, "b", cards=8)
    allocate(fleet_id=lab.id)
    assert TrainingJob.objects.get(pk=waiting.pk).state == "queued"
    text = staff.get(reverse("admin:fleets_fleet_change", args=[lab.pk])).content.decode()
    assert 'id="fleet-work"' in text
    assert "<strong>1</strong> queued" in text and "<strong>1</strong> starting" in text
    assert '<td class="cards-held">3</td>' in text and '<td class="cards-free">5</td>' in text


@pytest.mark.parametrize("kind", ["trainingjob", "lifecyclejob", "playgroundsession"])
def test_the_admin_shows_env_names_never_their_values(staff, lab, member, kind):
    """The API promises an env value is never shown again once submitted: the admin's
    change pages show the names only."""
    from audit.services import Actor
    from placement.services import submission
    from tests.conftest import SERVE

    actor, secret = Actor.of_user(member), {"SECRET_TOKEN": "s3cr3t-value"}
    common = {"project": "ml", "name": "x", "env": secret}
    record = {
        "trainingjob": lambda: submission.training_job_submit(
            actor=actor, command=["true"], **common
        ),
        "lifecyclejob": lambda: submission.lifecycle_job_submit(
            actor=actor, kind="export", command=["true"], **common
        ),
        "playgroundsession": lambda: submission.playground_session_submit(
            actor=actor, **{**SERVE, **common}
        ),
    }[kind]()
    page = staff.get(reverse(f"admin:placement_{kind}_change", args=[record.pk]))
    text = page.content.decode()
    assert page.status_code == 200
    assert "SECRET_TOKEN" in text and "s3cr3t-value" not in text


def test_a_jobs_page_frames_its_output_and_says_why_there_is_none_yet(staff, lab, member):
    queued = job(member)
    page = staff.get(f"/admin/placement/trainingjob/{queued.pk}/change/").content.decode()
    assert f'src="/admin/placement/trainingjob/{queued.pk}/output/"' in page
    response = staff.get(f"/admin/placement/trainingjob/{queued.pk}/output/")
    assert response["X-Frame-Options"] == "SAMEORIGIN"  # its own page frames it; the site DENYs
    framed = response.content.decode()
    assert "the job has no attempt yet" in framed and 'http-equiv="refresh"' in framed
    assert staff.get("/admin/placement/trainingjob/99999/output/").status_code == 404
