"""H5 on the real database (DESIGN §9): a Fleet's health check sent on each idle card of its
connected nodes, one card a check; the allocator holding a card out of work until its check
ended, the job waiting `health` with the numbers (Q8); a check's end, its output, its cleanup
and its result as the card's state; a failure quarantining the card as the breaker admits
(H6, H7), passes returning it; a timeout; a member's end owing its cards a check; no check on
a Fleet without one, on held cards, on nodes not connected or leaving. In the API, the admin
and the metrics. The pure decisions are tests/nodes/test_checks.py; a real agent running the
command confined, tests/e2e/test_health_checks.py."""

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import Actor
from fleets.services import fleet_update
from nodes import checks
from nodes.choices import CommandKind, CommandState, SchedulingState
from nodes.models import HealthBreaker, Node, NodeCommand
from nodes.services.checks import health_checks_run
from nodes.services.commands import Reported, node_command_report
from nodes.services.drains import node_drain
from placement.models import Member
from placement.services import submission
from placement.services.allocator import allocate
from tests.nodes.gpu_samples import send

CHECK = {"command": "nvidia-smi -q >/dev/null", "interval_seconds": 60, "timeout_seconds": 30}
XID = {"xid_counts": {"79": 1}}


@pytest.fixture
def wide(settings):
    settings.TUNEPLANE_HEALTH_BREAKER_SHARE = 1  # the breaker out of the way but where tested


def configure(fleet, **config):
    return fleet_update(actor=Actor.system("test"), fleet=fleet, config={**fleet.config, **config})


def awake(node: Node) -> Node:
    """Its lease far ahead: connected still when a test's clock moves on."""
    Node.objects.filter(pk=node.pk).update(lease_expires_at=timezone.now() + timedelta(days=1))
    return fresh(node)


def fresh(node: Node) -> Node:
    return Node.objects.get(pk=node.pk)


def checks_sent(node: Node) -> list[NodeCommand]:
    """The node's checks, oldest first, by card within one sweep."""
    return sorted(
        NodeCommand.objects.filter(node=node, kind=CommandKind.START, payload__health_check=True),
        key=lambda command: (command.created_at, command.payload["cards"][0]["index"]),
    )


def report(command: NodeCommand, state: str, exit_code: int = 0, **more) -> None:
    node_command_report(
        node_id=command.node_id, reported=Reported.of(command.pk, state, exit_code, **more)
    )


def complete(command: NodeCommand, exit_code: int = 0, detail: str = "") -> None:
    """The node runs the check, it ends, and the node confirms its cleanup (R7)."""
    report(command, CommandState.RUNNING)
    state = CommandState.SUCCEEDED if exit_code == 0 else CommandState.FAILED
    report(command, state, exit_code, detail=detail)
    report(command, state, exit_code, detail=detail, cleaned=True)


def job(member, cards: int = 1):
    made = submission.training_job_submit(
        actor=Actor.of_user(member), project="ml", name="sft", command=["true"], cards=cards
    )
    allocate(fleet_id=made.fleet_id)
    made.refresh_from_db()
    return made


@pytest.fixture
def checked_fleet(node_fleet):
    return configure(node_fleet, health_check=CHECK)


def test_H5_a_new_node_takes_no_work_before_its_cards_are_checked(checked_fleet, gpu_node, member):
    node = gpu_node(checked_fleet, cards=2)
    waiting = job(member)
    assert not Member.objects.exists()
    assert waiting.waiting["reason"] == "health", waiting.waiting
    assert waiting.waiting["numbers"]["checking"] == 2
    assert "awaiting their health check (2 of them, rule H5)" in waiting.waiting["message"]
    assert health_checks_run() == {"sent": 2, "timed_out": 0}
    sent = checks_sent(node)
    assert [c.payload["cards"] for c in sent] == [
        [{"index": d["index"], "uuid": d["uuid"]}] for d in node.inventory["devices"]
    ]  # one card a check, each alone
    assert all(c.payload["script"] == CHECK["command"] for c in sent)
    assert {r["state"] for r in fresh(node).card_checks.values()} == {checks.CHECKING}
    assert health_checks_run() == {"sent": 0, "timed_out": 0}  # one check at a time
    complete(sent[0])
    assert allocate(fleet_id=checked_fleet.id)["allocated"] == 1
    placed = Member.objects.get()
    assert placed.cards == sent[0].payload["cards"]  # the checked card, not the other


def test_H5_a_result_waits_for_the_checks_cleanup_before_the_card_takes_work(
    checked_fleet, gpu_node, member
):
    node = gpu_node(checked_fleet, cards=1)
    health_checks_run()
    (sent,) = checks_sent(node)
    report(sent, CommandState.RUNNING)
    report(sent, CommandState.SUCCEEDED, 0, detail="all good\n")
    cleanup = NodeCommand.objects.get(node=node, kind=CommandKind.CLEANUP)
    assert cleanup.payload["member"] == sent.pk
    record = fresh(node).card_checks[sent.payload["cards"][0]["uuid"]]
    assert (record["state"], record["result"]) == (checks.CHECKING, checks.PASSED)
    assert job(member).waiting["reason"] == "health"  # the node still holds the card (R7)
    report(sent, CommandState.SUCCEEDED, 0, detail="all good\n", cleaned=True)
    record = fresh(node).card_checks[sent.payload["cards"][0]["uuid"]]
    assert (record["state"], record["output"], record["exit_code"]) == ("passed", "all good\n", 0)
    assert allocate(fleet_id=checked_fleet.id)["allocated"] == 1
    event = AuditEvent.objects.get(action="node.card_check")
    assert event.after["card"]["check"] == "passed" and event.actor_label == "health-check"


def test_H5_a_failed_check_quarantines_its_card_with_its_output(
    checked_fleet, gpu_node, member, wide, admin_api, client, admin_user
):
    node = gpu_node(checked_fleet, cards=2)
    health_checks_run()
    bad, good = checks_sent(node)
    complete(bad, exit_code=3, detail="row remapping failure on bank 2\n")
    complete(good)
    node = fresh(node)
    uuid = bad.payload["cards"][0]["uuid"]
    assert node.unhealthy_cards[uuid]["reason"] == (
        "health check failed (exit 3): row remapping failure on bank 2"
    )
    assert node.card_count == 1
    assert node.card_checks[uuid]["state"] == checks.FAILED
    event = AuditEvent.objects.filter(action="node.card_check").order_by("id").first()
    assert event.after["card"]["check"] == "failed" and event.after["card"]["exit_code"] == 3
    job(member, cards=1)
    (placed,) = Member.objects.all()
    assert placed.cards == good.payload["cards"]  # never on the quarantined card
    send(node)  # a telemetry sample, so the node's cards show with their checks
    body = admin_api.get(f"/api/nodes/{node.id}").json()
    shown = {c["uuid"]: c["health_check"] for c in body["telemetry"]["cards"]}
    assert shown[uuid]["state"] == "failed" and shown[uuid]["exit_code"] == 3
    assert "row remapping" in shown[uuid]["output"]
    client.force_login(admin_user)
    page = client.get(f"/admin/nodes/node/{node.id}/change/").content.decode()
    assert "row remapping failure on bank 2" in page and "card-check" in page
    metrics = client.get("/metrics").content.decode()
    assert 'tuneplane_gpu_card_checks{fleet="gpu-lab",state="failed"} 1.0' in metrics
    assert 'tuneplane_gpu_card_checks{fleet="gpu-lab",state="passed"} 1.0' in metrics


def test_H5_H6_a_quarantined_card_returns_only_after_its_check_passes_n_times(
    checked_fleet, gpu_node, wide, settings
):
    """H6's health_returns_after counts check passes where the Fleet has a check; healthy
    telemetry samples return nothing there."""
    settings.TUNEPLANE_GPU_HEALTH_QUIET = 0
    configure(checked_fleet, health_returns_after=2)
    node = awake(gpu_node(checked_fleet, cards=1))
    send(node)
    health_checks_run()
    (first,) = checks_sent(node)
    complete(first, exit_code=1, detail="bad")
    assert fresh(node).card_count == 0
    at = timezone.now().timestamp()
    for k in range(1, 4):
        send(node, at=at + k)  # healthy samples: not a return here
    assert fresh(node).card_count == 0
    later = timezone.now() + timedelta(seconds=61)
    health_checks_run(now=later)
    complete(checks_sent(node)[-1])
    assert fresh(node).card_count == 0  # one pass of two
    health_checks_run(now=later + timedelta(seconds=61))
    complete(checks_sent(node)[-1])
    node = fresh(node)
    assert node.card_count == 1 and not node.unhealthy_cards
    returned = AuditEvent.objects.get(action="node.card_healthy")
    assert "passed 2 times in a row" in returned.after["card"]["why"]


def test_H5_a_fault_from_telemetry_owes_the_card_checks_before_it_returns(
    checked_fleet, gpu_node, wide, settings
):
    settings.TUNEPLANE_GPU_HEALTH_QUIET = 0
    node = gpu_node(checked_fleet, cards=1)
    send(node)
    health_checks_run()
    complete(checks_sent(node)[0])  # passed once before the fault
    send(node, {0: XID})
    record = next(iter(fresh(node).card_checks.values()))
    assert (record["state"], record["passes"]) == (checks.DUE, 0)
    assert health_checks_run()["sent"] == 1  # at once, not an interval later
    complete(checks_sent(node)[-1])
    assert fresh(node).card_count == 0  # one pass of the default two


def test_H5_a_check_past_its_timeout_is_stopped_and_fails(checked_fleet, gpu_node, wide):
    node = awake(gpu_node(checked_fleet, cards=1))
    start = timezone.now()
    health_checks_run(now=start)
    (sent,) = checks_sent(node)
    report(sent, CommandState.RUNNING)
    assert health_checks_run(now=start + timedelta(seconds=29))["timed_out"] == 0
    assert health_checks_run(now=start + timedelta(seconds=30))["timed_out"] == 1
    stop = NodeCommand.objects.get(node=node, kind=CommandKind.STOP)
    assert stop.payload["member"] == sent.pk
    node = fresh(node)
    (reason,) = [card["reason"] for card in node.unhealthy_cards.values()]
    assert reason == "health check failed (timed out): no result 30 s after it started"
    report(sent, CommandState.FAILED, 143)  # the stopped process's end is no second result
    report(sent, CommandState.FAILED, 143, cleaned=True)
    assert next(iter(fresh(node).card_checks.values()))["state"] == checks.FAILED
    assert health_checks_run(now=start + timedelta(seconds=31))["timed_out"] == 0


def test_H5_cards_a_member_leaves_are_checked_before_the_next_member(
    checked_fleet, gpu_node, member
):
    node = gpu_node(checked_fleet, cards=1)
    health_checks_run()
    complete(checks_sent(node)[0])
    first = job(member)
    held = Member.objects.get(attempt__training_job=first)
    assert health_checks_run()["sent"] == 0  # its card is held: never checked under it
    start = held.command
    report(start, CommandState.RUNNING)
    report(start, CommandState.SUCCEEDED, 0)
    report(start, CommandState.SUCCEEDED, 0, cleaned=True)
    assert next(iter(fresh(node).card_checks.values()))["state"] == checks.DUE
    second = job(member)
    assert second.waiting["reason"] == "health"
    assert health_checks_run()["sent"] == 1
    complete(checks_sent(node)[-1])
    assert allocate(fleet_id=checked_fleet.id)["allocated"] == 1


def test_H5_idle_cards_are_checked_again_every_interval(checked_fleet, gpu_node):
    node = awake(gpu_node(checked_fleet, cards=1))
    start = timezone.now()
    health_checks_run(now=start)
    complete(checks_sent(node)[0])
    assert health_checks_run(now=start + timedelta(seconds=59))["sent"] == 0
    assert health_checks_run(now=start + timedelta(seconds=61))["sent"] == 1


def test_H5_a_fleet_without_a_check_sends_none_and_places_unchecked_cards(
    node_fleet, gpu_node, member
):
    gpu_node(node_fleet, cards=1)
    assert health_checks_run() == {"sent": 0, "timed_out": 0}
    assert job(member).state == "running" or Member.objects.exists()


def test_H5_nodes_not_connected_or_leaving_are_not_checked(checked_fleet, gpu_node, admin_user):
    quiet = gpu_node(checked_fleet, cards=1, address="10.0.0.2:1")
    Node.objects.filter(pk=quiet.pk).update(lease_expires_at=timezone.now() - timedelta(1))
    draining = gpu_node(checked_fleet, cards=1, address="10.0.0.3:1")
    node_drain(actor=Actor.of_user(admin_user), node=draining, reason="rack move")
    assert fresh(draining).scheduling_state in (SchedulingState.DRAINING, SchedulingState.DRAINED)
    assert health_checks_run()["sent"] == 0


def test_H5_H7_a_failed_check_the_breaker_refuses_leaves_the_card_in_service(
    checked_fleet, gpu_node, member, settings
):
    """H7: a broken health check must not take a Fleet out of service — past the breaker's
    limit, a failing card is shown failed but keeps working."""
    settings.TUNEPLANE_HEALTH_BREAKER_SHARE = 0.2
    node = gpu_node(checked_fleet, cards=8)
    health_checks_run()
    for sent in checks_sent(node):
        complete(sent, exit_code=1, detail="check is broken")
    node = fresh(node)
    assert len(node.unhealthy_cards) == 1  # 20 % of 8, rounded down
    assert HealthBreaker.objects.get(fleet=checked_fleet).tripped
    assert {r["state"] for r in node.card_checks.values()} == {checks.FAILED}
    assert allocate(fleet_id=checked_fleet.id) is not None
    assert job(member, cards=7).waiting == {} or Member.objects.count() == 1


def test_H5_a_card_the_driver_cannot_open_is_quarantined_while_it_lasts(
    sampled_node, wide, settings
):
    """The built-in check each sample: a fault the node saw itself quarantines the card, and
    no healthy count returns it while its samples carry it; once they do not, it returns as
    any card does (H6)."""
    settings.TUNEPLANE_GPU_HEALTH_QUIET = 0
    fault = {"fault": "cannot open /dev/nvidia4: No such device"}
    at = timezone.now().timestamp()
    send(sampled_node, {4: fault}, at=at)
    node = fresh(sampled_node)
    uuid = node.inventory["devices"][4]["uuid"]
    assert node.unhealthy_cards[uuid]["reason"] == "cannot open /dev/nvidia4: No such device"
    assert node.card_count == 7
    for k in range(1, 5):
        send(sampled_node, {4: fault}, at=at + k)
    assert fresh(sampled_node).card_count == 7  # no return while the fault lasts
    for k in range(5, 7):
        send(sampled_node, at=at + k)
    assert fresh(sampled_node).card_count == 8


def test_H5_a_card_taken_out_of_the_machine_leaves_its_record(checked_fleet, gpu_node):
    node = gpu_node(checked_fleet, cards=2)
    health_checks_run()
    for sent in checks_sent(node):
        complete(sent)
    gone = node.inventory["devices"][1]["uuid"]
    inventory = {**node.inventory, "devices": node.inventory["devices"][:1]}
    Node.objects.filter(pk=node.pk).update(inventory=inventory)
    health_checks_run()
    assert set(fresh(node).card_checks) == {node.inventory["devices"][0]["uuid"]}
    assert gone not in fresh(node).card_checks
