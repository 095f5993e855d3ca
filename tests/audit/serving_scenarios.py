"""A1 for deployments on node Fleets (DESIGN §7, S1–S3): a replica placed and reported, a new
revision, a rollout's deadline, a stop. Merged into SCENARIOS by test_audit_completeness."""

from datetime import timedelta

from django.utils import timezone

from audit.services import Actor
from nodes.models import NodeCommand
from nodes.services import control
from placement.models import Deployment, Member, Revision
from placement.services import allocator, episodes, playground, serving, submission
from tests.conftest import H100_DEVICE_INVENTORY, SERVE

from .scenarios import Scenario, changed, created, deleted, deployment_update, submitted


def _deployment(w) -> Deployment:
    """A member's deployment on a node Fleet with one placeable node of 8 cards by UUID."""
    placeable = w.placeable()
    control.node_report_inventory(node_id=placeable.id, inventory=H100_DEVICE_INVENTORY)
    return submission.deployment_submit(
        actor=Actor.of_user(w.member), project="ml", name="chat", **SERVE
    )


def _placed(w) -> Member:
    deployment = _deployment(w)
    allocator.allocate(fleet_id=deployment.fleet_id)
    return Member.objects.get(revision__deployment=deployment)


def release_stopped(w):
    """A stopped deployment none of whose replicas was ever placed: nothing left to clean."""
    deployment = _deployment(w)
    serving.deployment_update(actor=Actor.of_user(w.admin), deployment=deployment, state="stopped")
    return lambda: serving.stopped_deployments_release(
        actor=Actor.of_user(w.admin), fleet=deployment.fleet
    )


def allocate_replica(w):
    fleet = _deployment(w).fleet
    return lambda: allocator.allocate(fleet_id=fleet.id)


def _session(w):
    placeable = w.placeable()
    control.node_report_inventory(node_id=placeable.id, inventory=H100_DEVICE_INVENTORY)
    return submission.playground_session_submit(
        actor=Actor.of_user(w.member), project="ml", name="try", **SERVE
    )


def session_placed(w):
    """The session's process placed, and its node reports it running and probed Ready."""
    session = _session(w)
    allocator.allocate(fleet_id=session.fleet_id)
    member = Member.objects.get(session=session)
    NodeCommand.objects.filter(pk=member.command_id).update(state="running", ready=True)
    command = NodeCommand.objects.get(pk=member.command_id)
    return lambda: playground.session_member_reported(
        member.session_id, command, {"state": "pending"}
    )


def session_end(w):
    session = _session(w)
    return lambda: playground.session_end(actor=Actor.of_user(w.member), session=session)


def session_past_ttl(w):
    _session(w)
    later = timezone.now() + timedelta(days=2)
    return lambda: playground.sessions_expire(now=later)


def _environment(w):
    placeable = w.placeable()
    control.node_report_inventory(node_id=placeable.id, inventory=H100_DEVICE_INVENTORY)
    return submission.environment_submit(
        actor=Actor.of_user(w.member), project="ml", name="env", manifest={"fleet": w.fleet().id}
    )


def episode_start(w):
    environment = _environment(w)
    return lambda: episodes.episode_start(
        actor=Actor.of_user(w.member), environment=environment, command=["true"]
    )


def _episode_placed(w) -> Member:
    environment = _environment(w)
    episode = episodes.episode_start(
        actor=Actor.of_user(w.member), environment=environment, command=["sleep", "60"]
    )
    allocator.allocate(fleet_id=environment.fleet_id)
    return Member.objects.get(episode=episode)


def episode_running(w):
    member = _episode_placed(w)
    NodeCommand.objects.filter(pk=member.command_id).update(state="running")
    command = NodeCommand.objects.get(pk=member.command_id)
    return lambda: episodes.episode_member_reported(
        member.episode_id, command, {"state": "pending"}
    )


def episode_late(w):
    _episode_placed(w)
    later = timezone.now() + timedelta(days=2)
    return lambda: episodes.episodes_time_out(now=later)


def episode_cancel(w):
    member = _episode_placed(w)
    return lambda: episodes.episode_cancel(actor=Actor.of_user(w.member), episode=member.episode)


def replica_running(w):
    """The node reports the replica's start command running and its probe passing."""
    member = _placed(w)
    NodeCommand.objects.filter(pk=member.command_id).update(state="running", ready=True)
    command = NodeCommand.objects.get(pk=member.command_id)
    deployment_id = member.revision.deployment_id
    return lambda: serving.deployment_member_reported(deployment_id, command, {"state": "pending"})


def revisions_stop(w):
    member = _placed(w)
    deployment = member.revision.deployment
    return lambda: serving.revisions_stop(deployment=deployment, actor=Actor.of_user(w.admin))


def revision_create(w):
    deployment = _deployment(w)
    return lambda: serving.revision_create(
        actor=Actor.of_user(w.member), deployment=deployment, env={"MODEL": "b"}
    )


def rollout_late(w):
    """A second revision that never became Ready, past its deadline."""
    deployment = _deployment(w)
    serving.revision_create(actor=Actor.of_user(w.member), deployment=deployment, port=8001)
    Revision.objects.filter(deployment=deployment).update(
        created_at=timezone.now() - timedelta(hours=1)
    )
    return serving.rollouts_settle


SCENARIOS = {
    "placement.services.submission.playground_session_submit": Scenario(
        submitted(submission.playground_session_submit, name="try", **SERVE),
        (created("playgroundsession.admitted"),),
    ),
    "placement.services.submission.deployment_submit": Scenario(
        submitted(submission.deployment_submit, name="chat", **SERVE),
        (created("deployment.admitted"),),
    ),
    # Stopped: its revisions too (a replica placed would get a stop command).
    "placement.services.serving.deployment_update": Scenario(
        deployment_update, (changed("deployment.state_changed"), changed("revision.stopped"))
    ),
    "placement.services.serving.stopped_deployments_release": Scenario(
        release_stopped, (deleted("deployment.deleted"),)
    ),
    # A replica placed: one writer for every kind (placement.services.allocator).
    "placement.services.allocator.allocate/replica": Scenario(
        allocate_replica, (created("replica.created"), created("node_command.created"))
    ),
    "placement.services.playground.session_member_reported": Scenario(
        session_placed, (changed("session_member.running"),)
    ),
    "placement.services.playground.session_end": Scenario(
        session_end, (changed("playgroundsession.ended"),)
    ),
    "placement.services.playground.sessions_expire": Scenario(
        session_past_ttl, (changed("playgroundsession.ended"),)
    ),
    "placement.services.episodes.episode_start": Scenario(
        episode_start, (created("episode.queued"),)
    ),
    # Its member runs, then the episode.
    "placement.services.episodes.episode_member_reported": Scenario(
        episode_running, (changed("episode_member.running"), changed("episode.running"))
    ),
    # Timed out at once, and a stop for its process.
    "placement.services.episodes.episodes_time_out": Scenario(
        episode_late, (changed("episode.timed_out"), created("node_command.created"))
    ),
    # Cancelled at once, and a stop for its process.
    "placement.services.episodes.episode_cancel": Scenario(
        episode_cancel, (changed("episode.cancelled"), created("node_command.created"))
    ),
    "placement.services.serving.deployment_member_reported": Scenario(
        replica_running, (changed("replica.running"),)
    ),
    # Its revision stopped, and a stop command for its replica.
    "placement.services.serving.revisions_stop": Scenario(
        revisions_stop, (changed("revision.stopped"), created("node_command.created"))
    ),
    "placement.services.serving.revision_create": Scenario(
        revision_create, (created("revision.created"),)
    ),
    "placement.services.serving.rollouts_settle": Scenario(
        rollout_late, (changed("revision.rolled_back"), changed("deployment.rolled_back"))
    ),
}

READS = {
    "placement.services.serving.locked_deployment",  # row locks, in the one order
    "placement.services.playground.session_ends_at",  # a pure computation
}
