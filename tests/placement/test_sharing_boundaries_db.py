"""Sharing's rules on the boundaries a targeted break moved (issue 47), on the real database:
a limit of 0 (Q1), a gang against a limit (Q2), use decayed over two passes (Q3), a job's own
shorter grace (Q6), a cordoned node that lists no devices (Q9). Each of these passed every
test when its rule's code was broken by hand; the pure ones are
test_sharing_boundaries.py's."""

import math
from datetime import UTC, datetime, timedelta

from nodes.services.cordons import node_cordon
from placement.models import Member, Quota, TrainingJob, Usage
from placement.services.allocator import allocate
from placement.services.ledger import pass_book
from tests.conftest import H100_INVENTORY, SYSTEM, placeable_node
from tests.placement import test_preempting
from tests.placement.test_preempting import running_for, stops
from tests.placement.test_quotas import QUOTAS, submit

WEEK = 7 * 86400
# Preemption's fixtures: one node of eight cards (lab); cv guaranteed all 8, ml borrowing
# (shared).
lab = test_preempting.lab
shared = test_preempting.shared


def test_Q1_a_limit_of_zero_below_its_guarantee_is_a_400_naming_the_limit(lab, admin_api, project):
    """0 is a limit, not "unlimited": below a guarantee of 8 it is refused like 4 is, naming
    the field, and nothing is written; 0 with a guarantee of 0 holds no card at all."""
    response = admin_api.request(
        "PUT", QUOTAS, {"quotas": [{"project": "ml", "guaranteed": 8, "limit": 0}]}
    )
    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == "quotas[0].limit"
    assert "0 is less than its guaranteed 8" in response.json()["error"]["message"]
    assert not Quota.objects.exists()
    response = admin_api.request("PUT", QUOTAS, {"quotas": [{"project": "ml", "limit": 0}]})
    assert response.status_code == 200, response.content
    assert response.json()["quotas"][0]["limit"] == 0


def test_Q1_Q2_a_limit_of_zero_refuses_even_one_card(lab, admin_api, member_api):
    admin_api.request("PUT", QUOTAS, {"quotas": [{"project": "ml", "limit": 0}]})
    body = {"project": "ml", "name": "one", "cards": 1, "command": ["true"]}
    refused = member_api.post("/api/training-jobs", body)
    assert refused.status_code == 422, refused.content
    assert refused.json()["error"]["message"] == (
        "project ml may hold at most 0 cards on gpu-lab; this asks 1 (rule Q2)."
    )


def test_Q2_a_gang_counts_its_cards_on_every_node_against_the_limit(
    node_fleet, two_nodes, admin_api, member_api
):
    """4 cards × 2 nodes asks 8 cards: past a limit of 4, though each node's share is 4."""
    admin_api.request("PUT", QUOTAS, {"quotas": [{"project": "ml", "limit": 4}]})
    body = {"project": "ml", "name": "gang", "cards": 4, "nodes": 2, "command": ["true"]}
    refused = member_api.post("/api/training-jobs", body)
    assert refused.status_code == 422, refused.content
    assert (refused.json()["error"]["reason"], refused.json()["error"]["message"]) == (
        "quota",
        "project ml may hold at most 4 cards on gpu-lab; this asks 8 (rule Q2).",
    )
    assert not TrainingJob.objects.exists()
    admitted = member_api.post("/api/training-jobs", {**body, "cards": 2})  # 2 × 2 = 4
    assert admitted.status_code == 201, admitted.content


def test_Q3_use_decays_once_per_elapsed_time_over_two_passes(lab, project, admin_api):
    """Each pass brings a project's use forward from the time the last one wrote: a week
    halves it (the half-life), two weeks quarter it — never decayed twice from an old time."""
    admin_api.request("PUT", QUOTAS, {"quotas": [{"project": "ml", "guaranteed": 0}]})
    start = datetime(2026, 12, 1, tzinfo=UTC)
    Usage.objects.create(fleet=lab, project=project, card_seconds=8 * 86400.0, as_of=start)
    for weeks, share in ((1, 1 / 2), (2, 1 / 4)):
        at = start + timedelta(seconds=weeks * WEEK)
        book = pass_book(lab, at)
        usage = Usage.objects.get(fleet=lab, project=project)
        assert usage.as_of == at
        assert math.isclose(usage.card_seconds, 8 * 86400.0 * share, rel_tol=1e-9)
        assert math.isclose(book.usage[project.pk], usage.card_seconds, rel_tol=1e-9)


def test_Q6_a_victims_deadline_is_its_own_shorter_grace_exactly(shared, member, vision, settings):
    """The Fleet's grace is 120 s; a job asking 5 s gets SIGKILL 5 s after SIGTERM: its stop
    and its recorded deadline say 5 s, and its preemptor waits until that deadline."""
    settings.TUNEPLANE_PREEMPT_GRACE = 120
    victim = submit(member, "ml", "quick", cards=8, preemption_grace_seconds=5)
    allocate(fleet_id=shared.id)
    members = running_for(victim, 3600)
    owner = submit(vision, "cv", "owner", cards=8)
    assert allocate(fleet_id=shared.id)["preempted"] == 1
    [stop] = stops(members)
    assert stop.payload["grace_seconds"] == 5
    preemption = TrainingJob.objects.get(pk=victim.pk).preemption
    at, deadline = (datetime.fromisoformat(preemption[k]) for k in ("at", "deadline"))
    assert deadline - at == timedelta(seconds=5)
    waiting = TrainingJob.objects.get(pk=owner.pk).waiting
    assert waiting["reason"] == "preempting"
    assert f"stopped by {preemption['deadline']} at the latest" in waiting["message"]
    assert not Member.objects.filter(attempt__training_job=owner).exists()


def test_Q9_a_cordoned_node_listing_no_devices_is_never_said_to_fit(
    make_fleet, mint, member_api, project
):
    """A refusal names cordoned nodes that would fit once uncordoned (D1); a node that counts
    8 cards but lists no devices would not (the allocator cannot hold them), so it is not
    named, cordoned or not."""
    fleet = make_fleet("gpu-lab", capabilities=["train"])
    node = placeable_node(mint, fleet, H100_INVENTORY, "10.0.0.9:1")
    node_cordon(actor=SYSTEM, node=node, reason="RMA ticket 42")
    body = {"project": "ml", "name": "w", "cards": 2, "command": ["true"]}
    refused = member_api.post("/api/training-jobs", body)
    assert refused.status_code == 422, refused.content
    message = refused.json()["error"]["message"]
    assert refused.json()["error"]["reason"] == "inventory_fit"
    assert "would fit" not in message and node.id not in message and "RMA" not in message


def test_Q3_a_pass_decides_by_the_configured_half_life_and_each_quotas_weight(
    lab, project, admin_api, settings
):
    settings.TUNEPLANE_FAIR_SHARE_HALF_LIFE = 86400
    admin_api.request("PUT", QUOTAS, {"quotas": [{"project": "ml", "weight": 3}]})
    start = datetime(2026, 12, 1, tzinfo=UTC)
    Usage.objects.create(fleet=lab, project=project, card_seconds=1000.0, as_of=start)
    book = pass_book(lab, start + timedelta(days=1))
    assert book.rows[(project.pk, "")].weight == 3
    assert math.isclose(book.usage[project.pk], 500.0, rel_tol=1e-9)  # one half-life
    assert math.isclose(book.tau, 86400 / math.log(2), rel_tol=1e-9)


def test_Q3_use_grows_by_every_card_a_project_holds_under_each_of_its_quotas(
    lab, project, member, admin_api
):
    """2 H100s under its h100 quota and 3 cards under its any-card quota: its use grows as
    5 cards held since the last pass, decayed as it grows."""
    quotas = [{"project": "ml", "series": "h100", "guaranteed": 2}, {"project": "ml"}]
    admin_api.request("PUT", QUOTAS, {"quotas": quotas})
    submit(member, "ml", "pinned", cards=2, series="h100")
    submit(member, "ml", "any", cards=3)
    assert allocate(fleet_id=lab.id)["allocated"] == 2
    first = datetime(2026, 12, 1, tzinfo=UTC)
    pass_book(lab, first)  # the next pass: its use counted from here, 0 so far
    since = Usage.objects.get(fleet=lab, project=project)
    assert (since.as_of, since.card_seconds) == (first, 0.0)
    book = pass_book(lab, first + timedelta(days=1))
    kept = math.exp(-86400 / book.tau)
    expected = 5 * book.tau * (1 - kept)
    assert math.isclose(book.usage[project.pk], expected, rel_tol=1e-9)
    assert math.isclose(Usage.objects.get(pk=since.pk).card_seconds, expected, rel_tol=1e-9)
