"""Playground sessions (S4) and episodes (S5, S6) on node Fleets, in process on the real
database: placement, their nodes' reports, lifetimes and timeouts, bad input. The same with a
real agent running real processes is tests/e2e/test_sessions_episodes.py."""

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.services import Actor
from nodes.choices import CommandKind
from nodes.models import Node, NodeCommand
from placement.models import CardHold, Episode, Member, PlaygroundSession
from placement.services import episodes, playground, submission
from placement.services.allocator import allocate
from tests.conftest import SERVE

from .test_serving import report, stops_for


@pytest.fixture
def lab(make_fleet, gpu_node):
    """A node Fleet that serves and runs environments, with two placeable nodes."""
    fleet = make_fleet("gpu-lab", kind="node", capabilities=["train", "serve", "env"])
    return fleet, [gpu_node(fleet, address=f"10.0.0.{n}:1") for n in (1, 2)]


@pytest.fixture
def environment(lab, member):
    return submission.environment_submit(
        actor=Actor.of_user(member), project="ml", name="env", manifest={"fleet": "gpu-lab"}
    )


def play(member, **fields) -> PlaygroundSession:
    return submission.playground_session_submit(
        actor=Actor.of_user(member), project="ml", name="try", **{**SERVE, **fields}
    )


def test_S4_a_session_is_placed_served_like_a_replica_and_shows_its_address_once_ready(
    lab, member, member_api
):
    session = play(member, ttl_seconds=600)
    assert timedelta(seconds=590) < session.ends_at - timezone.now() <= timedelta(seconds=600)
    assert allocate(fleet_id="gpu-lab")["allocated"] == 1
    [process] = Member.objects.filter(session=session).select_related("node")
    assert NodeCommand.objects.get(pk=process.command_id).payload["serve"]["port"] == 8000
    shown = member_api.get(f"/api/playground-sessions/{session.pk}").json()
    assert (shown["state"], shown["address"]) == ("live", None)
    report(process, ready=True)
    shown = member_api.get(f"/api/playground-sessions/{session.pk}").json()
    host = process.node.address.split(":")[0]
    assert shown["address"] == f"{host}:8000" and shown["members"][0]["ready"] is True


def test_S4_at_its_lifetime_a_session_is_stopped_then_cleaned_and_its_cards_released(lab, member):
    session = play(member, ttl_seconds=60)
    allocate(fleet_id="gpu-lab")
    [process] = Member.objects.filter(session=session)
    report(process, ready=True)
    assert playground.sessions_expire()["ended"] == 0  # not yet
    assert playground.sessions_expire(now=timezone.now() + timedelta(seconds=61))["ended"] == 1
    session.refresh_from_db()
    assert (session.state, stops_for(process)) == ("stopped", 1)
    assert "lifetime" in session.reason
    report(process, "failed", exit_code=-15, reason="stopped", cleaned=True)
    process.refresh_from_db()
    assert (process.state, process.cleanup) == ("cancelled", "cleaned")
    assert not CardHold.objects.filter(member=process).exists()


@pytest.mark.parametrize(
    ("ended", "reason"),
    [
        ({"exit_code": 1, "reason": "exit"}, "its process ended: exit (exit code 1)"),
        ({"exit_code": -1, "reason": "refused"}, "its process ended: refused (exit code -1)"),
    ],
)
def test_S4_a_session_whose_process_ends_on_its_own_ends_saying_why(lab, member, ended, reason):
    """Not left live with nothing serving it: the session ends, its member is cleaned up
    and its cards are released once its node confirms."""
    session = play(member)
    allocate(fleet_id="gpu-lab")
    [process] = Member.objects.filter(session=session)
    report(process, ready=True)
    report(process, "failed", **ended)
    session.refresh_from_db()
    assert (session.state, session.reason) == ("stopped", reason)
    assert stops_for(process) == 0  # nothing left to stop
    assert NodeCommand.objects.filter(kind=CommandKind.CLEANUP, payload__member=process.command_id)
    assert allocate(fleet_id="gpu-lab")["allocated"] == 0  # not placed again


def test_S4_delete_ends_a_session_early_and_a_second_delete_is_a_conflict(lab, member, member_api):
    session = play(member)
    allocate(fleet_id="gpu-lab")
    [process] = Member.objects.filter(session=session)
    response = member_api.delete(f"/api/playground-sessions/{session.pk}")
    assert response.status_code == 200 and response.json()["state"] == "stopped"
    assert stops_for(process) == 1
    assert member_api.delete(f"/api/playground-sessions/{session.pk}").status_code == 409


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"ttl_seconds": 0}, "ttl_seconds"),
        ({"ttl_seconds": 10**9}, "ttl_seconds"),
        ({"port": None}, "port"),
        ({"replicas": 2}, "replicas"),
        ({"command": [], "script": ""}, "command"),
    ],
)
def test_S4_bad_session_input_is_a_400_naming_the_field_and_writes_nothing(
    lab, member_api, body, field
):
    response = member_api.post(
        "/api/playground-sessions", {"project": "ml", "name": "p", **SERVE, **body}
    )
    assert response.status_code == 400 and field in response.content.decode(), response.content
    assert not PlaygroundSession.objects.exists()


def test_S5_an_episode_runs_on_a_node_answering_for_env_and_ends_by_its_exit(
    lab, member, member_api, environment
):
    nodes = lab[1]
    Node.objects.filter(pk=nodes[0].pk).update(quiet_env=True)  # not a candidate now (L3)
    path = f"/api/environments/{environment.pk}/episodes"
    response = member_api.post(path, {"command": ["python3", "run.py"], "cards": 1})
    assert response.status_code == 201, response.content
    assert response.json()["state"] == "queued"
    allocate(fleet_id="gpu-lab")
    [process] = Member.objects.filter(episode__number=1)
    assert process.node_id == nodes[1].pk and len(process.cards) == 1
    report(process)
    assert member_api.get(f"{path}/1").json()["state"] == "running"
    report(process, "failed", exit_code=3, reason="exit")
    shown = member_api.get(f"{path}/1").json()
    assert (shown["state"], shown["exit_code"], shown["node"]) == ("failed", 3, nodes[1].pk)
    assert shown["duration_seconds"] >= 0
    assert NodeCommand.objects.filter(kind=CommandKind.CLEANUP).count() == 1


def test_S5_an_episode_without_a_command_runs_the_manifests(lab, member):
    environment = submission.environment_submit(
        actor=Actor.of_user(member),
        project="ml",
        name="env",
        manifest={"fleet": "gpu-lab", "command": ["python3", "env.py"]},
    )
    episode = episodes.episode_start(actor=Actor.of_user(member), environment=environment)
    assert episode.command == ["python3", "env.py"] and episode.timeout_seconds == 600


def test_S5_S6_an_episode_ends_by_its_own_timeout_never_by_its_nodes_silence(
    lab, member, environment
):
    episode = episodes.episode_start(
        actor=Actor.of_user(member),
        environment=environment,
        command=["sleep", "1000"],
        timeout_seconds=30,
    )
    allocate(fleet_id="gpu-lab")
    [process] = Member.objects.filter(episode=episode)
    report(process)
    Node.objects.filter(pk=process.node_id).update(quiet_env=True)  # S6: quiet for env
    assert episodes.episodes_time_out()["timed_out"] == 0
    episode.refresh_from_db()
    assert episode.state == "running"  # the silence fails nothing
    later = timezone.now() + timedelta(seconds=31)
    assert episodes.episodes_time_out(now=later)["timed_out"] == 1
    episode.refresh_from_db()
    assert (episode.state, stops_for(process)) == ("timed_out", 1)
    report(process, "failed", exit_code=-15, reason="stopped")  # how it ends changes nothing
    episode.refresh_from_db()
    assert episode.state == "timed_out" and episode.exit_code is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "command"),  # neither given nor in the manifest
        ({"command": ["true"], "timeout_seconds": 0}, "timeout_seconds"),
        ({"command": ["true"], "timeout_seconds": 10**9}, "timeout_seconds"),
        ({"command": ["true"], "cards": -1}, "cards"),
        ({"command": ["true"], "env": {"A": 1}}, "env.A"),
        ({"command": ["true"], "bogus": 1}, "bogus"),
    ],
)
def test_S5_bad_episode_input_is_a_400_naming_the_field_and_writes_nothing(
    lab, member_api, environment, body, field
):
    response = member_api.post(f"/api/environments/{environment.pk}/episodes", body)
    assert response.status_code == 400 and field in response.content.decode(), response.content
    assert not Episode.objects.exists()


def test_S5_cancel_ends_a_queued_or_running_episode_and_an_ended_one_is_a_conflict(
    lab, member_api, outsider_api, environment
):
    path = f"/api/environments/{environment.pk}/episodes"
    assert member_api.post(path, {"command": ["sleep", "60"]}).status_code == 201
    allocate(fleet_id="gpu-lab")
    [process] = Member.objects.filter(episode__number=1)
    report(process)
    assert outsider_api.post(f"{path}/1/cancel").status_code == 404
    cancelled = member_api.post(f"{path}/1/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert stops_for(process) == 1
    again = member_api.post(f"{path}/1/cancel")
    assert again.status_code == 409 and again.json()["error"]["code"] == "episode_ended"
    assert member_api.post(path, {"command": ["true"], "cards": 8}).status_code == 201
    queued = member_api.post(f"{path}/2/cancel").json()  # not placed yet: no pass has run
    assert (queued["state"], queued["node"]) == ("cancelled", None)


def test_D3_a_gone_node_running_an_episode_is_removed_by_force_and_its_member_abandoned(
    lab, member, environment, admin_api
):
    """Issue 36's bug: the episode's member was marked failed/abandoned, a cleanup went to
    the node already removed, and D4's refusal rolled the removal back (409 node_removed)."""
    from audit.models import AuditEvent

    episode = episodes.episode_start(
        actor=Actor.of_user(member), environment=environment, command=["sleep", "1000"]
    )
    allocate(fleet_id="gpu-lab")
    [process] = Member.objects.filter(episode=episode)
    report(process)
    Node.objects.filter(pk=process.node_id).update(scheduling_state="gone")
    response = admin_api.delete(f"/api/nodes/{process.node_id}?force=true")
    # The removal answers with the removed node (the API's DELETE on a node, DESIGN §4).
    assert response.status_code == 200, response.content
    process.refresh_from_db()
    assert (process.state, process.reason) == ("abandoned", "abandoned")
    assert Node.objects.get(pk=process.node_id).scheduling_state == "removed"
    removal = AuditEvent.objects.get(action="node.removed", target_id=process.node_id)
    assert removal.forced
    assert not NodeCommand.objects.filter(node_id=process.node_id, kind="cleanup").exists()
