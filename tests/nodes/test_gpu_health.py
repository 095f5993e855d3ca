"""GPU health from telemetry (issue 19), in process, on the real database: a card with a new
fatal XID, rising uncorrectable ECC errors, or missing from a sample that had it is
unhealthy and out of new work at once — admission's fit (P7) and the allocator (R1) both —
while the rest of the node works on; every card unhealthy cordons the node (source
gpu-health), lifted by itself once a card is healthy again; an operator's cordon is never
lifted by it (L6); a Fleet whose on_card_fault is continue stops nothing running (D1, H6).
The quarantine's own rules (H6, H7) are tests/nodes/test_h6_h7_quarantine.py; the real
stream is tests/e2e/test_telemetry.py."""

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import Actor
from nodes.choices import CordonSource
from nodes.models import Node, NodeCommand, NodeCordon
from nodes.selectors import nodes_placeable
from nodes.services.cordons import node_cordon
from placement.models import CardHold, Member
from placement.services import submission
from placement.services.allocator import allocate
from tests.nodes.gpu_samples import send
from tuneplane.errors import PlacementRefused


def refreshed(node: Node) -> Node:
    return Node.objects.get(pk=node.pk)


def submit(member, cards: int):
    return submission.training_job_submit(
        actor=Actor.of_user(member), project="ml", name="sft", command=["true"], cards=cards
    )


def test_a_new_fatal_xid_takes_exactly_that_card_out_of_admission_fit(sampled_node, member):
    assert refreshed(sampled_node).card_count == 8
    send(sampled_node, {3: {"xid_counts": {"79": 1}}})
    sampled_node = refreshed(sampled_node)
    assert set(sampled_node.unhealthy_cards) == {sampled_node.inventory["devices"][3]["uuid"]}
    assert (
        sampled_node.unhealthy_cards[sampled_node.inventory["devices"][3]["uuid"]]["reason"]
        == "XID 79"
    )
    assert sampled_node.card_count == 7 and sampled_node.series_cards == {"h100": 7}
    with pytest.raises(PlacementRefused) as refused:
        submit(member, 8)  # P7: the fit sees the change at once
    assert refused.value.reason == "inventory_fit"
    assert submit(member, 7).fleet_id == sampled_node.fleet_id  # the rest of the node works on
    assert nodes_placeable([sampled_node.fleet_id]).filter(pk=sampled_node.pk).exists()


def test_the_allocator_never_holds_an_unhealthy_card(sampled_node, member):
    sick = sampled_node.inventory["devices"][0]["uuid"]
    send(sampled_node, {0: {"xid_counts": {"48": 2}}})
    job = submit(member, 7)
    assert allocate(fleet_id=job.fleet_id)["allocated"] == 1
    held = set(CardHold.objects.filter(node=sampled_node).values_list("uuid", flat=True))
    assert len(held) == 7 and sick not in held


def test_an_xid_that_is_not_fatal_or_not_new_changes_nothing(sampled_node):
    send(
        sampled_node, {1: {"xid_counts": {"13": 5, "31": 1}}}
    )  # application faults: not the card's
    assert refreshed(sampled_node).unhealthy_cards == {}
    send(sampled_node, {1: {"xid_counts": {"79": 1}}})
    send(sampled_node, {1: {"xid_counts": {"79": 1}}})  # the same count again: nothing new
    assert AuditEvent.objects.filter(action="node.card_unhealthy").count() == 1


def test_uncorrectable_ecc_errors_rising_make_a_card_unhealthy_counts_alone_do_not(
    node_fleet,
    gpu_node,
):
    node = gpu_node(node_fleet)
    send(node, {2: {"ecc_uncorrected": 4, "ecc_corrected": 900}})  # since the driver loaded
    assert refreshed(node).unhealthy_cards == {}
    send(node, {2: {"ecc_uncorrected": 4, "ecc_corrected": 950}})  # corrected ones: fine
    assert refreshed(node).unhealthy_cards == {}
    send(node, {2: {"ecc_uncorrected": 5}})
    (reason,) = [c["reason"] for c in refreshed(node).unhealthy_cards.values()]
    assert reason == "uncorrectable ECC errors 4 → 5"


def test_a_card_missing_from_a_sample_that_had_it_is_unhealthy_a_failed_probe_is_not(sampled_node):
    send(sampled_node, source="", without=range(8))  # the probe failed: nothing is judged
    assert refreshed(sampled_node).unhealthy_cards == {}
    send(sampled_node, without=(5,))
    sampled_node = refreshed(sampled_node)
    assert [c["reason"] for c in sampled_node.unhealthy_cards.values()] == [
        "missing from the sample"
    ]
    assert sampled_node.card_count == 7


def test_healthy_again_only_after_the_quiet_period(sampled_node, settings):
    settings.TUNEPLANE_GPU_HEALTH_QUIET = 300
    now = timezone.now().timestamp()
    send(sampled_node, {3: {"xid_counts": {"79": 1}}}, at=now)
    send(sampled_node, {3: {"xid_counts": {"79": 1}}}, at=now + 299)
    assert refreshed(sampled_node).card_count == 7
    send(sampled_node, {3: {"xid_counts": {"79": 1}}}, at=now + 301)
    assert refreshed(sampled_node).card_count == 8 and refreshed(sampled_node).unhealthy_cards == {}
    events = AuditEvent.objects.filter(action__startswith="node.card_").order_by("id")
    assert [e.action for e in events] == ["node.card_unhealthy", "node.card_healthy"]


def test_a_card_back_from_missing_is_quiet_from_its_return_not_its_last_missing_sample(
    sampled_node, settings
):
    """A node sends no sample while its cards stay as they were: a card missing at the last
    sample was missing until the sample that shows it back."""
    settings.TUNEPLANE_GPU_HEALTH_QUIET = 300
    now = timezone.now().timestamp()
    send(sampled_node, without=(3,), at=now)
    send(sampled_node, at=now + 290)  # back, after a silence
    send(sampled_node, {0: {"utilization_percent": 90.0}}, at=now + 310)
    assert refreshed(sampled_node).card_count == 7
    send(sampled_node, at=now + 591)
    assert refreshed(sampled_node).card_count == 8


def test_every_card_unhealthy_cordons_the_node_and_a_healthy_card_lifts_it(sampled_node, settings):
    """H6: a node with every card quarantined is cordoned by the system, the cordon lifted by
    the system as a card returns (after health_returns_after healthy samples)."""
    settings.TUNEPLANE_HEALTH_BREAKER_SHARE = 1  # H7 is tests/nodes/test_h6_h7_quarantine.py
    xids = {i: {"xid_counts": {"79": 1}} for i in range(8)}
    send(sampled_node, {i: xids[i] for i in range(7)})
    assert not NodeCordon.objects.filter(node=sampled_node).exists()  # one card still works
    send(
        sampled_node, xids
    )  # card 7's XID is new; the others stay unhealthy within the quiet period
    cordon = NodeCordon.objects.get(node=sampled_node)
    assert cordon.source == CordonSource.GPU_HEALTH and "every card unhealthy" in cordon.reason
    assert not nodes_placeable([sampled_node.fleet_id]).filter(pk=sampled_node.pk).exists()
    settings.TUNEPLANE_GPU_HEALTH_QUIET = 0
    send(sampled_node, xids)  # no new XID: cards 0-6 healthy twice in a row, card 7 once
    assert not NodeCordon.objects.filter(node=sampled_node).exists()
    assert refreshed(sampled_node).card_count == 7
    send(sampled_node, xids)
    assert refreshed(sampled_node).card_count == 8


def test_L6_an_operator_cordon_outlives_the_gpu_health_one(sampled_node, settings, admin_user):
    settings.TUNEPLANE_GPU_HEALTH_QUIET = 0
    settings.TUNEPLANE_HEALTH_BREAKER_SHARE = 1
    send(sampled_node, {i: {"xid_counts": {"79": 1}} for i in range(8)})
    node_cordon(actor=Actor.of_user(admin_user), node=sampled_node, reason="bad riser")
    for _ in range(2):  # healthy again after two healthy samples in a row (H6)
        send(sampled_node, {i: {"xid_counts": {"79": 1}} for i in range(8)})
    sources = set(NodeCordon.objects.filter(node=sampled_node).values_list("source", flat=True))
    assert sources == {CordonSource.OPERATOR}
    assert not nodes_placeable([sampled_node.fleet_id]).filter(pk=sampled_node.pk).exists()


def test_H6_a_fleet_that_says_continue_stops_nothing_running_on_a_quarantined_card(
    sampled_node, member, settings
):
    """D1 as H6 leaves it: on_card_fault: continue keeps the member running."""
    settings.TUNEPLANE_HEALTH_BREAKER_SHARE = 1
    fleet = sampled_node.fleet
    fleet.config = {**fleet.config, "on_card_fault": "continue"}
    fleet.save(update_fields=["config"])
    job = submit(member, 8)
    allocate(fleet_id=job.fleet_id)
    member_record = Member.objects.get(attempt__training_job=job)
    commands = NodeCommand.objects.count()
    send(sampled_node, {i: {"xid_counts": {"79": 1}} for i in range(8)})
    assert NodeCordon.objects.filter(node=sampled_node, source=CordonSource.GPU_HEALTH).exists()
    assert NodeCommand.objects.count() == commands  # no stop, no cleanup
    assert Member.objects.get(pk=member_record.pk).state == member_record.state
    assert CardHold.objects.filter(member=member_record).count() == 8


def test_a_card_taken_out_of_the_inventory_is_no_longer_missing(sampled_node):
    from nodes.services.control import node_report_inventory

    send(sampled_node, without=(7,))
    assert len(refreshed(sampled_node).unhealthy_cards) == 1
    inventory = {**sampled_node.inventory, "devices": sampled_node.inventory["devices"][:7]}
    inventory["cards"] = [{"name": inventory["devices"][0]["name"], "count": 7}]
    node_report_inventory(node_id=sampled_node.id, inventory=inventory)
    send(refreshed(sampled_node))
    sampled_node = refreshed(sampled_node)
    assert sampled_node.unhealthy_cards == {} and sampled_node.card_count == 7


def test_the_fleet_page_shows_each_card_its_health_and_why(sampled_node, client, admin_user):
    send(sampled_node, {4: {"xid_counts": {"79": 1}, "utilization_percent": 87.0}})
    client.force_login(admin_user)
    page = client.get(f"/admin/fleets/fleet/{sampled_node.fleet_id}/change/").content.decode()
    group = page[page.index('id="group-telemetry"') :]
    assert group.count('class="tp-card"') == 8
    sick = sampled_node.inventory["devices"][4]["uuid"]
    card_html = group[group.index(f'data-uuid="{sick}"') :].split("</div>")[0]
    assert 'data-health="unhealthy"' in card_html and "XID 79" in card_html
    assert 'style="width: 87%"' in card_html
    assert group.count('data-health="healthy"') == 7
