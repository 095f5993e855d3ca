"""H6 and H7 on the real database (DESIGN §9): a card that fails is quarantined at the flush
of the sample that shows it, with its reason, in the API, the admin and the metrics; the
member on it stopped as its Fleet says; a node with every card quarantined cordoned by the
system; a card back after health_returns_after healthy samples or an operator's return
(audited). The breaker: quarantine up to the limit within the window, the rest recorded and
shown, the breaker tripped (audited, a metric, a banner) until an operator resets it; one
Fleet's breaker is not another's. The pure decisions are tests/nodes/test_quarantine.py."""

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import Actor
from fleets.services import fleet_update
from nodes.choices import CommandKind, CordonSource
from nodes.models import CardFault, HealthBreaker, Node, NodeCommand, NodeCordon
from nodes.services.health import card_return, health_breaker_reset
from placement.models import Member
from placement.services import submission
from placement.services.allocator import allocate
from tests.nodes.gpu_samples import send
from tuneplane.deployment_settings import check_config
from tuneplane.errors import Conflict, ValidationFailed

XID = {"xid_counts": {"79": 1}}


def refreshed(node: Node) -> Node:
    return Node.objects.get(pk=node.pk)


def uuid_of(node: Node, index: int) -> str:
    return node.inventory["devices"][index]["uuid"]


def configure(fleet, **config):
    return fleet_update(actor=Actor.system("test"), fleet=fleet, config={**fleet.config, **config})


@pytest.fixture
def wide(settings):
    settings.TUNEPLANE_HEALTH_BREAKER_SHARE = 1  # the breaker out of the way of H6's tests


def test_H6_a_fatal_xid_quarantines_the_card_at_that_sample_with_its_reason(
    sampled_node, admin_api, client, admin_user, wide
):
    send(sampled_node, {2: XID})
    node = refreshed(sampled_node)
    assert node.unhealthy_cards[uuid_of(node, 2)]["reason"] == "XID 79"
    assert node.card_count == 7
    fault = CardFault.objects.get()
    assert (fault.index, fault.quarantined, fault.reason) == (2, True, "XID 79")
    body = admin_api.get(f"/api/nodes/{node.id}").json()
    (card,) = [c for c in body["telemetry"]["cards"] if c["index"] == 2]
    assert (card["health"], card["health_reason"]) == ("unhealthy", "XID 79")
    client.force_login(admin_user)
    page = client.get(f"/admin/nodes/node/{node.id}/change/").content.decode()
    assert "XID 79" in page  # the node's page
    metrics = client.get("/metrics").content.decode()
    assert 'tuneplane_gpu_cards{fleet="gpu-lab",health="unhealthy"} 1.0' in metrics


def test_H6_the_sample_interval_quarantines_within_a_minute(settings):
    """The flush of the sample that shows a fault quarantines it: a sample every interval,
    flushed every flush interval, is the most a fault waits."""
    assert settings.TUNEPLANE_TELEMETRY_INTERVAL + settings.TUNEPLANE_TELEMETRY_FLUSH_INTERVAL < 60


def running_job(member, cards: int):
    job = submission.training_job_submit(
        actor=Actor.of_user(member), project="ml", name="sft", command=["true"], cards=cards
    )
    allocate(fleet_id=job.fleet_id)
    return Member.objects.get(attempt__training_job=job)


def test_H6_a_training_member_on_a_quarantined_card_is_stopped_through_its_stop_path(
    sampled_node, member, wide
):
    held = running_job(member, 8)
    send(sampled_node, {5: XID})
    stop = NodeCommand.objects.get(node=sampled_node, kind=CommandKind.STOP)
    assert stop.payload["member"] == held.command_id and stop.created_by == "gpu-health"
    event = AuditEvent.objects.get(action="node.card_fault_member")
    assert event.after["cards"] == [5] and event.after["on_card_fault"] == "stop"
    send(sampled_node, {5: XID, 6: XID})  # another card of the same member: no second stop
    assert NodeCommand.objects.filter(kind=CommandKind.STOP).count() == 1


def test_H6_a_member_on_other_cards_of_the_node_runs_on(sampled_node, member, wide):
    held = running_job(member, 4)
    free = next(
        i for i in range(8) if uuid_of(sampled_node, i) not in {c["uuid"] for c in held.cards}
    )
    send(sampled_node, {free: XID})
    assert not NodeCommand.objects.filter(kind=CommandKind.STOP).exists()


def test_H6_on_card_fault_is_validated():
    assert check_config("node", {"on_card_fault": "continue", "health_returns_after": 3})
    with pytest.raises(ValidationFailed):
        check_config("node", {"on_card_fault": "halt"})
    for bad in (0, -1, True, "2", 101):
        with pytest.raises(ValidationFailed):
            check_config("node", {"health_returns_after": bad})


def test_H6_a_card_returns_after_the_fleets_health_returns_after_healthy_samples(
    sampled_node, settings, wide
):
    settings.TUNEPLANE_GPU_HEALTH_QUIET = 0
    configure(sampled_node.fleet, health_returns_after=3)
    at = timezone.now().timestamp()
    send(sampled_node, {1: XID}, at=at)
    for k in (1, 2):
        send(sampled_node, {1: XID}, at=at + k)  # healthy, the same count: 1 then 2 passes
        assert refreshed(sampled_node).card_count == 7
    send(sampled_node, {1: XID}, at=at + 3)
    assert refreshed(sampled_node).card_count == 8
    assert AuditEvent.objects.filter(action="node.card_healthy").count() == 1


def test_H6_a_fault_between_healthy_samples_starts_the_count_again(sampled_node, settings, wide):
    settings.TUNEPLANE_GPU_HEALTH_QUIET = 0
    at = timezone.now().timestamp()
    send(sampled_node, {1: XID}, at=at)
    send(sampled_node, {1: XID}, at=at + 1)  # one pass
    send(sampled_node, {1: {"xid_counts": {"79": 2}}}, at=at + 2)  # a new fault
    send(sampled_node, {1: {"xid_counts": {"79": 2}}}, at=at + 3)  # one pass again
    assert refreshed(sampled_node).card_count == 7
    send(sampled_node, {1: {"xid_counts": {"79": 2}}}, at=at + 4)
    assert refreshed(sampled_node).card_count == 8


def test_H6_every_card_quarantined_cordons_the_node_an_operator_return_lifts_it_audited(
    sampled_node, admin_api, admin_user, wide
):
    send(sampled_node, dict.fromkeys(range(8), XID))
    assert NodeCordon.objects.get(node=sampled_node).source == CordonSource.GPU_HEALTH
    node = card_return(
        node_id=sampled_node.pk, uuid=uuid_of(sampled_node, 0), actor=Actor.of_user(admin_user)
    )
    assert node.card_count == 1 and not NodeCordon.objects.filter(node=node).exists()
    response = admin_api.post(f"/api/nodes/{node.id}/cards/{uuid_of(node, 1)}/return")
    assert response.status_code == 200, response.content
    assert refreshed(node).card_count == 2
    events = AuditEvent.objects.filter(action="node.card_returned").order_by("id")
    assert [e.before["card"]["index"] for e in events] == [0, 1]
    assert events[1].actor_label == admin_user.username or events[1].actor_id
    again = admin_api.post(f"/api/nodes/{node.id}/cards/{uuid_of(node, 1)}/return")
    assert again.status_code == 409  # not quarantined now


def test_H6_the_admin_returns_a_nodes_quarantined_cards(sampled_node, client, admin_user, wide):
    send(sampled_node, {3: XID, 4: XID})
    client.force_login(admin_user)
    client.post(
        "/admin/nodes/node/",
        {"action": "return_quarantined_cards", "_selected_action": [sampled_node.pk]},
    )
    assert refreshed(sampled_node).unhealthy_cards == {}
    assert AuditEvent.objects.filter(action="node.card_returned").count() == 2


# H7 --------------------------------------------------------------------------------------


def test_H7_a_burst_quarantines_up_to_the_share_records_the_rest_and_trips_audited(
    node_fleet, gpu_node, admin_api, client, admin_user
):
    """Two nodes of 8 cards: 20 % of 16 is 3 cards. Five faults: three quarantined, two
    recorded only, the breaker tripped once."""
    one = gpu_node(node_fleet, address="10.0.0.1:1")
    two = gpu_node(node_fleet, address="10.0.0.2:1")
    send(one), send(two)
    send(one, {0: XID, 1: XID})
    assert not HealthBreaker.objects.get(fleet=node_fleet).tripped
    send(two, {0: XID, 1: XID, 2: XID})
    assert len(refreshed(one).unhealthy_cards) == 2
    assert len(refreshed(two).unhealthy_cards) == 1  # exactly at the share: 3 of 16
    recorded = CardFault.objects.filter(quarantined=False)
    assert sorted(recorded.values_list("index", flat=True)) == [1, 2]
    assert HealthBreaker.objects.get(fleet=node_fleet).tripped
    (tripped,) = AuditEvent.objects.filter(action="fleet.health_breaker_tripped")
    assert "3 of 16 cards" in tripped.after["reason"]
    # While tripped, a new fault is recorded, shown, not quarantined — and not twice.
    send(one, {0: XID, 1: XID, 5: XID})
    send(one, {0: XID, 1: XID, 5: XID}, without=(7,))
    assert len(refreshed(one).unhealthy_cards) == 2
    assert CardFault.objects.filter(quarantined=False, node=one).count() == 2  # 5, 7 missing
    shown = admin_api.get(f"/api/fleets/{node_fleet.pk}/health-breaker").json()
    assert shown["tripped"] and shown["limit"] == 3 and shown["cards"] == 16
    assert shown["quarantined_in_window"] == 3
    assert [f["quarantined"] for f in shown["faults"]].count(False) == 4
    # The banner (Fleet page and node page) and the metric.
    client.force_login(admin_user)
    page = client.get(f"/admin/fleets/fleet/{node_fleet.pk}/change/").content.decode()
    assert 'id="health-breaker-tripped"' in page
    node_page = client.get(f"/admin/nodes/node/{one.pk}/change/").content.decode()
    assert "Health breaker tripped on Fleet gpu-lab" in node_page
    metrics = client.get("/metrics").content.decode()
    assert 'tuneplane_health_breaker_tripped{fleet="gpu-lab"} 1.0' in metrics


def test_H7_an_operator_resets_the_breaker_audited_and_quarantine_runs_again(
    node_fleet, gpu_node, admin_api, client, admin_user
):
    node = gpu_node(node_fleet, cards=4)  # 20 % of 4: the one card a Fleet may always lose
    send(node)
    send(node, {0: XID, 1: XID})
    assert len(refreshed(node).unhealthy_cards) == 1
    assert HealthBreaker.objects.get(fleet=node_fleet).tripped
    assert admin_api.post(f"/api/fleets/{node_fleet.pk}/health-breaker/reset").status_code == 200
    assert AuditEvent.objects.filter(action="fleet.health_breaker_reset").count() == 1
    assert admin_api.post(f"/api/fleets/{node_fleet.pk}/health-breaker/reset").status_code == 409
    send(node, {0: XID, 1: {"xid_counts": {"79": 2}}})  # card 1's fault again: quarantined
    assert len(refreshed(node).unhealthy_cards) == 2
    # ...which is the limit from the reset on: the next trips it again.
    send(node, {0: XID, 1: {"xid_counts": {"79": 2}}, 2: XID})
    assert len(refreshed(node).unhealthy_cards) == 2
    breaker = HealthBreaker.objects.get(fleet=node_fleet)
    assert breaker.tripped
    client.force_login(admin_user)
    client.post(
        "/admin/fleets/fleet/",
        {"action": "reset_health_breaker", "_selected_action": [node_fleet.pk]},
    )
    assert not HealthBreaker.objects.get(fleet=node_fleet).tripped
    assert AuditEvent.objects.filter(action="fleet.health_breaker_reset").count() == 2


def test_H7_a_quarantine_a_window_old_no_longer_counts(node_fleet, gpu_node, settings):
    settings.TUNEPLANE_HEALTH_BREAKER_WINDOW = 600
    node = gpu_node(node_fleet, cards=4)  # the limit: one card
    at = timezone.now().timestamp() - 1000
    send(node, at=at)
    send(node, {0: XID}, at=at)
    send(node, {0: XID, 1: XID}, at=at + 599)  # within the window: refused, trips
    assert uuid_of(node, 1) not in refreshed(node).unhealthy_cards
    assert HealthBreaker.objects.get(fleet=node_fleet).tripped
    HealthBreaker.objects.filter(fleet=node_fleet).update(tripped_at=None)  # the window alone
    send(node, {0: XID, 1: XID, 2: XID}, at=at + 600)  # card 0's is exactly a window old
    assert uuid_of(node, 2) in refreshed(node).unhealthy_cards
    assert not HealthBreaker.objects.get(fleet=node_fleet).tripped


def test_H7_one_fleets_tripped_breaker_leaves_another_fleet_quarantining(
    node_fleet, make_fleet, gpu_node
):
    other = make_fleet("other-lab", kind="node", capabilities=["train"])
    here = gpu_node(node_fleet, cards=2, address="10.0.0.1:1")
    there = gpu_node(other, cards=2, address="10.0.0.2:1")
    send(here), send(there)
    send(here, {0: XID, 1: XID})
    assert HealthBreaker.objects.get(fleet=node_fleet).tripped
    send(there, {0: XID})
    assert len(refreshed(there).unhealthy_cards) == 1
    assert not HealthBreaker.objects.get(fleet=other).tripped


def test_H7_a_reset_of_a_breaker_never_tripped_is_refused(node_fleet, admin_user):
    with pytest.raises(Conflict):
        health_breaker_reset(fleet_id=node_fleet.pk, actor=Actor.of_user(admin_user))


def test_H7_the_window_counts_time_not_samples(node_fleet, gpu_node):
    """Within the window the limit holds across separate flushes and nodes."""
    one = gpu_node(node_fleet, cards=5, address="10.0.0.1:1")  # 20 % of 10 cards: two
    two = gpu_node(node_fleet, cards=5, address="10.0.0.2:1")
    at = timezone.now().timestamp()
    send(one, at=at), send(two, at=at)
    send(one, {0: XID}, at=at + 60)
    send(two, {0: XID}, at=at + 120)
    send(one, {0: XID, 1: XID}, at=at + 180)
    assert len(refreshed(one).unhealthy_cards) + len(refreshed(two).unhealthy_cards) == 2
    assert CardFault.objects.filter(quarantined=False).count() == 1
    assert HealthBreaker.objects.get(fleet=node_fleet).tripped


def test_H6_H1_the_attempt_of_a_member_stopped_for_its_card_ends_infrastructure(
    node_fleet, gpu_node, member, settings
):
    from nodes.services.commands import Reported, node_command_report

    settings.TUNEPLANE_INFRA_BACKOFF_FIRST = 0
    node = gpu_node(node_fleet, cards=2)
    send(node)
    held = running_job(member, 1)
    node_command_report(node_id=node.id, reported=Reported(held.command_id, "running", None, ""))
    send(node, {held.cards[0]["index"]: XID})
    assert NodeCommand.objects.filter(kind=CommandKind.STOP).count() == 1
    # The agent's answer to the stop: SIGTERM, exit 143, "stopped".
    node_command_report(
        node_id=node.id, reported=Reported(held.command_id, "failed", 143, "stopped")
    )
    attempt = held.attempt
    attempt.refresh_from_db()
    assert attempt.end_class == "infrastructure"
    assert attempt.training_job.state == "queued"  # max_attempts not spent


def test_H7_a_card_quarantined_again_within_the_window_is_still_one_card(
    node_fleet, gpu_node, settings
):
    settings.TUNEPLANE_GPU_HEALTH_QUIET = 0
    node = gpu_node(node_fleet, cards=4)  # the limit: one card
    at = timezone.now().timestamp()
    send(node, at=at)
    send(node, {0: XID}, at=at + 1)
    send(node, {0: XID}, at=at + 2)
    send(node, {0: XID}, at=at + 3)  # two healthy samples: back
    assert refreshed(node).unhealthy_cards == {}
    send(node, {0: {"xid_counts": {"79": 2}}}, at=at + 4)  # it fails again
    assert uuid_of(node, 0) in refreshed(node).unhealthy_cards
    assert not HealthBreaker.objects.get(fleet=node_fleet).tripped
    send(node, {0: {"xid_counts": {"79": 2}}, 1: XID}, at=at + 5)  # another card: past it
    assert HealthBreaker.objects.get(fleet=node_fleet).tripped
