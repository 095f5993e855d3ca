"""Deployments on node Fleets in process (DESIGN §7, S1–S3), on the real database: replicas
placed with their cards and ports, their nodes' reports followed, a rollout's order and
deadline, a stop. The same with a real agent serving real HTTP is
tests/e2e/test_deployments.py."""

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import Actor
from fleets.services import fleet_delete
from nodes.choices import CommandKind, SchedulingState
from nodes.models import Node, NodeCommand
from nodes.services.commands import Reported, node_command_report
from nodes.services.drains import node_drain
from nodes.services.removal import node_remove
from placement.models import CardHold, Deployment, Member, Revision
from placement.selectors import deployments_with_status, replica_not_ready
from placement.services import serving, submission
from placement.services.allocator import allocate
from placement.services.reconcile import members_reconcile
from placement.services.waiting import replica_backoff, waiting
from tests.conftest import SERVE, SYSTEM
from tuneplane.errors import Conflict, ValidationFailed


@pytest.fixture
def lab(node_fleet, gpu_node):
    """Two placeable nodes of eight cards."""
    return node_fleet, [gpu_node(node_fleet, address=f"10.0.0.{n}:1") for n in (1, 2)]


def deploy(member, **fields) -> Deployment:
    return submission.deployment_submit(
        actor=Actor.of_user(member), project="ml", name="chat", **{**SERVE, **fields}
    )


def replicas(deployment, number=None):
    found = Member.objects.filter(revision__deployment=deployment).select_related("revision")
    if number is not None:
        found = found.filter(revision__number=number)
    return list(found.order_by("revision__number", "rank"))


def report(member, state="running", **fields):
    node_command_report(
        node_id=member.node_id, reported=Reported(member.command_id, state, **fields)
    )


def stops_for(member) -> int:
    return NodeCommand.objects.filter(
        kind=CommandKind.STOP, payload__member=member.command_id
    ).count()


def test_S1_each_replica_is_placed_on_a_node_with_its_cards_and_port_and_told_what_to_serve(
    lab, member
):
    deployment = deploy(member, replicas=2, cards=2, env={"MODEL": "a"})
    assert allocate(fleet_id="gpu-lab")["allocated"] == 2
    first, second = replicas(deployment)
    assert {first.node_id, second.node_id} == {node.id for node in lab[1]}  # one port per node
    assert len(first.cards) == 2 and CardHold.objects.filter(member=first).count() == 2
    payload = NodeCommand.objects.get(pk=first.command_id).payload
    assert payload["serve"] == {"port": 8000, "readiness_path": "/"}
    assert payload["argv"] == SERVE["command"] and payload["env"] == {"MODEL": "a"}
    assert allocate(fleet_id="gpu-lab")["allocated"] == 0  # placed once


def test_S1_a_port_in_use_on_a_node_keeps_another_replica_off_it(lab, member):
    deploy(member, replicas=2)
    other = submission.deployment_submit(
        actor=Actor.of_user(member), project="ml", name="other", **SERVE
    )
    assert allocate(fleet_id="gpu-lab")["allocated"] == 2
    assert replicas(other) == []  # both nodes have port 8000 taken
    elsewhere = submission.deployment_submit(
        actor=Actor.of_user(member), project="ml", name="third", **{**SERVE, "port": 8001}
    )
    assert allocate(fleet_id="gpu-lab")["allocated"] == 1 and len(replicas(elsewhere)) == 1


def test_S1_ready_is_running_and_probed_and_each_change_of_it_is_one_audit_event(lab, member):
    deployment = deploy(member)
    allocate(fleet_id="gpu-lab")
    [replica] = replicas(deployment)
    shown = serving_status(deployment)
    assert shown == ("degraded", "starting")
    report(replica, detail="connection refused on port 8000")
    assert serving_status(deployment) == (
        "degraded",
        "probe failing: connection refused on port 8000",
    )
    report(replica, ready=True)
    assert serving_status(deployment) == ("ready", "")
    report(replica, ready=True)  # the same again: nothing to record
    report(replica, reason="restarting", restarts=1, detail="exited with 1; restarting in 1s")
    assert serving_status(deployment) == (
        "degraded",
        "process restarting (1 restarts so far): exited with 1; restarting in 1s",
    )
    actions = list(
        AuditEvent.objects.filter(target_type="placement.member", target_id=str(replica.pk))
        .order_by("id")
        .values_list("action", flat=True)
    )
    assert actions == ["replica.created", "replica.running", "replica.ready", "replica.not_ready"]


def serving_status(deployment) -> tuple[str, str]:
    replica = Member.objects.select_related("node").get(revision__deployment=deployment)
    return serving_status_of(deployment), replica_not_ready(replica)


def test_S3_a_quiet_or_gone_node_degrades_its_replicas_and_nothing_is_stopped_or_given_up(
    lab, member
):
    deployment = deploy(member)
    allocate(fleet_id="gpu-lab")
    [replica] = replicas(deployment)
    report(replica, ready=True)
    Node.objects.filter(pk=replica.node_id).update(quiet_serve=True)
    assert serving_status(deployment) == ("degraded", "node quiet for serve (L2)")
    Node.objects.filter(pk=replica.node_id).update(
        scheduling_state=SchedulingState.GONE,
        last_seen_at=timezone.now() - timedelta(days=1),
    )
    members_reconcile()  # a job's member would be unknown, then lost: a replica never moves
    assert serving_status(deployment) == ("degraded", "node gone")
    replica.refresh_from_db()
    assert (replica.state, stops_for(replica)) == ("running", 0)
    Node.objects.filter(pk=replica.node_id).update(
        quiet_serve=False, scheduling_state=SchedulingState.SCHEDULABLE
    )
    assert serving_status(deployment) == ("ready", "")


def test_S2_old_replicas_stop_one_per_new_ready_one_then_the_old_revision_retires(lab, member):
    deployment = deploy(member, replicas=2)
    allocate(fleet_id="gpu-lab")
    for old in replicas(deployment, 1):
        report(old, ready=True)
    serving.revision_create(actor=Actor.of_user(member), deployment=deployment, port=8001)
    allocate(fleet_id="gpu-lab")
    old = replicas(deployment, 1)
    new = replicas(deployment, 2)
    assert len(new) == 2 and [stops_for(m) for m in old] == [0, 0]  # beside the old ones
    report(new[0])  # running, not yet Ready: still nothing stopped
    assert [stops_for(m) for m in old] == [0, 0]
    report(new[0], ready=True)  # one new Ready: one old stopped, never below two Ready
    assert sorted(stops_for(m) for m in old) == [0, 1]
    report(new[1], ready=True)
    assert [stops_for(m) for m in old] == [1, 1]
    assert list(deployment.revisions.values_list("state", flat=True)) == ["retired", "live"]
    assert serving_status_of(deployment) == "ready"


def serving_status_of(deployment) -> str:
    return deployments_with_status(Deployment.objects.filter(pk=deployment.pk)).get().status


def test_S2_a_revision_not_ready_by_its_deadline_is_rolled_back_and_the_old_untouched(
    lab, member, settings
):
    deployment = deploy(member)
    allocate(fleet_id="gpu-lab")
    [old] = replicas(deployment)
    report(old, ready=True)
    serving.revision_create(
        actor=Actor.of_user(member), deployment=deployment, port=8001, env={"BAD": "1"}
    )
    allocate(fleet_id="gpu-lab")
    [new] = replicas(deployment, 2)
    report(new, detail="HTTP 500 from /")
    assert serving.rollouts_settle()["rolled_back"] == 0  # within its deadline
    later = timezone.now() + timedelta(seconds=settings.TUNEPLANE_ROLLOUT_DEADLINE + 1)
    assert serving.rollouts_settle(now=later)["rolled_back"] == 1
    deployment.refresh_from_db()
    assert deployment.reason == (
        "revision 2 rolled back: 0 of 1 replicas Ready within 600s; replica 0: "
        "HTTP 500 from / (rule S2)"
    )
    assert (stops_for(new), stops_for(old)) == (1, 0)
    assert list(deployment.revisions.values_list("state", flat=True)) == ["live", "rolled_back"]
    assert serving_status_of(deployment) == "ready"
    assert serving.rollouts_settle(now=later)["rolled_back"] == 0  # once


def test_S2_a_rollback_places_again_the_old_replicas_its_rollout_had_stopped(lab, member):
    deployment = deploy(member, replicas=2)
    allocate(fleet_id="gpu-lab")
    for old in replicas(deployment, 1):
        report(old, ready=True)
    serving.revision_create(actor=Actor.of_user(member), deployment=deployment, port=8001)
    allocate(fleet_id="gpu-lab")
    report(replicas(deployment, 2)[0], ready=True)  # one new Ready: one old stopped
    [stopped] = [m for m in replicas(deployment, 1) if stops_for(m)]
    report(stopped, "failed", exit_code=-15, reason="stopped", cleaned=True)
    assert allocate(fleet_id="gpu-lab")["allocated"] == 0  # mid-rollout: not replaced
    later = timezone.now() + timedelta(hours=1)
    assert serving.rollouts_settle(now=later)["rolled_back"] == 1
    assert allocate(fleet_id="gpu-lab")["allocated"] == 1  # the old revision whole again
    again = [m for m in replicas(deployment, 1) if m.state == "starting"]
    assert [m.rank for m in again] == [stopped.rank]


def test_S2_a_rollout_counts_only_its_own_stops_of_old_replicas(lab, member):
    """Revision 2's rollout stopped an old replica and was rolled back; the old revision was
    made whole again. Revision 3's first Ready replica still stops an old one: the stop of
    revision 2's rollout is not this rollout's."""
    deployment = deploy(member, replicas=2)
    allocate(fleet_id="gpu-lab")
    for old in replicas(deployment, 1):
        report(old, ready=True)
    serving.revision_create(actor=Actor.of_user(member), deployment=deployment, port=8001)
    allocate(fleet_id="gpu-lab")
    report(replicas(deployment, 2)[0], ready=True)
    [stopped] = [m for m in replicas(deployment, 1) if stops_for(m)]
    report(stopped, "failed", exit_code=-15, reason="stopped", cleaned=True)
    assert serving.rollouts_settle(now=timezone.now() + timedelta(hours=1))["rolled_back"] == 1
    allocate(fleet_id="gpu-lab")
    [again] = [m for m in replicas(deployment, 1) if m.state == "starting"]
    report(again, ready=True)
    for leftover in replicas(deployment, 2):
        report(leftover, "failed", exit_code=-15, reason="stopped", cleaned=True)
    serving.revision_create(actor=Actor.of_user(member), deployment=deployment, port=8002)
    allocate(fleet_id="gpu-lab")
    live_old = [m for m in replicas(deployment, 1) if m.state == "running"]
    assert len(live_old) == 2 and not any(stops_for(m) for m in live_old)
    report(replicas(deployment, 3)[0], ready=True)
    assert sorted(stops_for(m) for m in live_old) == [0, 1]


def test_S2_a_revision_keeping_the_old_port_where_every_node_serves_it_is_refused_at_creation(
    lab, member
):
    """A new revision rolls out beside the old one: on the port every node's old replica
    holds it could never be placed, and would only be rolled back at the deadline."""
    everywhere = deploy(member, replicas=2)  # port 8000 on both nodes
    allocate(fleet_id="gpu-lab")
    with pytest.raises(ValidationFailed) as refused:
        serving.revision_create(
            actor=Actor.of_user(member), deployment=everywhere, env={"MODEL": "b"}
        )
    assert refused.value.field == "port" and "8000" in str(refused.value)
    assert list(everywhere.revisions.values_list("number", flat=True)) == [1]
    serving.revision_create(actor=Actor.of_user(member), deployment=everywhere, port=8001)
    one_node = submission.deployment_submit(  # one replica: the other node's 8100 is free
        actor=Actor.of_user(member), project="ml", name="one", **{**SERVE, "port": 8100}
    )
    allocate(fleet_id="gpu-lab")
    serving.revision_create(actor=Actor.of_user(member), deployment=one_node, env={"M": "c"})


def test_S1_a_replica_its_node_refuses_is_placed_again_after_a_doubling_backoff(lab, member):
    """Not at once: a node that refuses (its card taken, say) would be asked again and
    again. 1 s after the first refusal, 2 s after the second, 4 s ... at most 60 s."""
    deployment = deploy(member)
    allocate(fleet_id="gpu-lab")
    long_ago = timezone.now() - timedelta(hours=1)
    for wait in (1, 2, 4):
        [refused] = [m for m in replicas(deployment) if m.state == "starting"]
        report(refused, "failed", exit_code=-1, reason="refused", cleaned=True)
        ended = Member.objects.get(pk=refused.pk).ended_at
        [waiting_replica] = waiting(lab[0])
        assert waiting_replica.request(ended).not_before == ended + timedelta(seconds=wait)
        assert allocate(fleet_id="gpu-lab")["allocated"] == 0  # its backoff holds it
        Member.objects.filter(pk=refused.pk).update(ended_at=long_ago)
        assert allocate(fleet_id="gpu-lab")["allocated"] == 1
    stopped = [m for m in replicas(deployment) if m.state == "starting"]
    report(stopped[0], "failed", exit_code=-15, reason="stopped", cleaned=True)
    assert allocate(fleet_id="gpu-lab")["allocated"] == 1  # a stop it did not ask for: at once
    assert [replica_backoff(n).total_seconds() for n in (1, 7, 50)] == [1, 60, 60]


def test_S1_R7_F7_a_stopped_deployments_replicas_are_stopped_cleaned_and_release_their_cards(
    lab, member, admin_user
):
    deployment = deploy(member, replicas=2)
    allocate(fleet_id="gpu-lab")
    first, second = replicas(deployment)
    report(first, ready=True)
    serving.deployment_update(actor=Actor.of_user(member), deployment=deployment, state="stopped")
    assert [stops_for(m) for m in (first, second)] == [1, 1]
    assert list(deployment.revisions.values_list("state", flat=True)) == ["stopped"]
    report(first, "failed", exit_code=-15, reason="stopped")
    first.refresh_from_db()
    assert (first.state, first.reason) == ("cancelled", "stopped")
    assert NodeCommand.objects.filter(kind=CommandKind.CLEANUP).count() == 1
    assert CardHold.objects.filter(member=first).exists()  # held until the cleanup (R7)
    report(first, "failed", exit_code=-15, reason="stopped", cleaned=True)
    assert not CardHold.objects.filter(member=first).exists()
    assert allocate(fleet_id="gpu-lab")["allocated"] == 0  # a stopped deployment is not placed
    # F7: once every replica is cleaned and the nodes are gone, the Fleet may be deleted.
    for node in lab[1]:
        node_drain(actor=SYSTEM, node=node, reason="retiring the lab")
    with pytest.raises(Conflict, match="1 stopped deployments still cleaning up"):
        fleet_delete(actor=SYSTEM, fleet=lab[0])
    report(second, "failed", exit_code=-15, reason="stopped", cleaned=True)
    for node in lab[1]:
        node_remove(actor=SYSTEM, node=Node.objects.get(pk=node.pk))
    fleet_delete(actor=SYSTEM, fleet=lab[0])
    assert not Deployment.objects.exists()
    assert AuditEvent.objects.filter(action="deployment.deleted").count() == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"command": [], "script": ""}, "command"),
        ({"port": None}, "port"),
        ({"port": 0}, "port"),
        ({"port": 70000}, "port"),
        ({"port": True}, "port"),
        ({"readiness_path": "health"}, "readiness_path"),
        ({"readiness_path": "/a b"}, "readiness_path"),
        ({"replicas": 0}, "replicas"),
        ({"replicas": 65}, "replicas"),
        ({"env": {"PORT": "1"}}, "env.PORT"),
        ({"env": {"A": 1}}, "env.A"),
        ({"command": ["python", 3]}, "command[1]"),
        ({"cpus": 0}, "cpus"),
        ({"memory_bytes": 5}, "memory_bytes"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_S1_bad_input_on_every_serve_field_is_a_400_naming_it_and_writes_nothing(
    lab, member_api, body, field
):
    response = member_api.post(
        "/api/deployments", {"project": "ml", "name": "chat", **SERVE, **body}
    )
    assert response.status_code == 400, response.content
    assert field in response.content.decode()
    assert not Deployment.objects.exists() and not Revision.objects.exists()
    assert not AuditEvent.objects.filter(action="deployment.admitted").exists()


def test_S2_a_new_revision_inherits_what_it_does_not_say_and_refuses_bad_input(
    lab, member, member_api
):
    deployment = deploy(member, replicas=2, env={"MODEL": "a"})
    path = f"/api/deployments/{deployment.pk}/revisions"
    assert member_api.post(path, {"readiness_path": "nope"}).status_code == 400
    assert member_api.post(path, {"command": []}).status_code == 400  # nothing to run
    assert deployment.revisions.count() == 1
    response = member_api.post(path, {"env": {"MODEL": "b"}, "port": 8001})
    assert response.status_code == 201, response.content
    second = deployment.revisions.get(number=2)
    assert (second.command, second.env, second.port, second.replicas) == (
        SERVE["command"],
        {"MODEL": "b"},
        8001,
        2,
    )
    serving.deployment_update(actor=Actor.of_user(member), deployment=deployment, state="stopped")
    assert member_api.post(path, {"port": 8002}).status_code == 409


def test_S2_revisions_roll_out_on_node_fleets_only(member, make_fleet):
    """A kubernetes Fleet's deployment is a record: its Ready is its node's (L2); it takes
    no revision to roll out, and no port makes its Ready a replica's."""
    fleet = make_fleet("k8s", kind="kubernetes", capabilities=["serve"])
    deployment = Deployment.objects.create(
        project=submission.project_for(member, "ml"), fleet=fleet, name="d", cards=0
    )
    Revision.objects.create(deployment=deployment, number=1)
    with pytest.raises(Conflict, match="roll out on node Fleets"):
        serving.revision_create(actor=Actor.of_user(member), deployment=deployment, port=8001)
    assert deployment.revisions.count() == 1
