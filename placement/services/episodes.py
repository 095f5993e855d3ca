"""Episodes of an environment on a node Fleet (S5, S6).

An episode is one member, run once: the allocator resolves its node per episode from the
environment's Fleet's nodes answering for env now (P5, L3) and placeable (L1), with cards if
it asks for them. It ends by its exit — ``succeeded`` or ``failed`` with its exit code — or
by its own timeout (``timeout_seconds``, counted from its start): it is then ``timed_out``
at once and its process stopped and cleaned up. Quiet for env never fails an episode in
flight (S6): it only keeps new ones off that node; a gone node's episode ends by its timeout.

Writers lock the environment, then the episode, then its members (after a node command,
which a report has locked first).
"""

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from audit.services import Actor, audit_record
from fleets.choices import FleetKind, FleetState
from nodes.choices import CommandKind, CommandState
from nodes.models import NodeCommand
from nodes.services.logs import log_tail_fetch
from tuneplane.errors import Conflict, NotFound

from ..choices import EPISODE_ENDED, RUN_LIVE, EpisodeState, RunState
from ..models import Environment, Episode, Member
from ..runspec import checked_episode
from .allocator import allocate_on_commit
from .runs import ENDED_AS, RUNS, _cleaned, _send
from .serving import _grace

EPISODES = Actor.system("episodes")


def episode_start(*, actor: Actor, environment: Environment, **fields) -> Episode:
    """S5: one episode of the environment, queued for the allocator; what it runs is the
    request's command or script, else the manifest's."""
    run = checked_episode(
        manifest=environment.manifest,
        max_timeout=settings.TUNEPLANE_EPISODE_MAX_TIMEOUT,
        **fields,
    )
    with transaction.atomic():
        environment = (
            Environment.objects.select_for_update().select_related("fleet").get(pk=environment.pk)
        )
        fleet = environment.fleet
        if fleet.kind != FleetKind.NODE:
            raise Conflict(
                f"Fleet '{fleet.id}' is a {fleet.kind} Fleet: episodes run on node Fleets, "
                "where the console's agents run them.",
                code="not_a_node_fleet",
            )
        if fleet.state != FleetState.ACTIVE:
            raise Conflict(
                f"Fleet '{fleet.id}' is {fleet.state}: it takes no new work (rule D1).",
                code="fleet_not_active",
            )
        number = (environment.episodes.aggregate(n=Max("number"))["n"] or 0) + 1
        episode = Episode.objects.create(
            environment=environment, number=number, created_by=actor.user, **run
        )
        audit_record(
            actor=actor,
            action="episode.queued",
            target=episode,
            after={
                "environment": environment.pk,
                "number": number,
                "cards": episode.cards,
                "timeout_seconds": episode.timeout_seconds,
                "env": sorted(episode.env),
            },
        )
        allocate_on_commit(fleet.id)
    return episode


def _locked(episode_id: int):
    environment_id = Episode.objects.filter(pk=episode_id).values_list("environment_id").get()[0]
    Environment.objects.select_for_update().filter(pk=environment_id).first()
    episode = Episode.objects.select_for_update().get(pk=episode_id)
    return episode, list(episode.members.select_for_update().order_by("pk"))


def _moved(episode: Episode, before: dict, actor: Actor = EPISODES) -> None:
    episode.save(update_fields=["state", "reason", "exit_code", "started_at", "ended_at"])
    audit_record(
        actor=actor,
        action=f"episode.{episode.state}",
        target=episode,
        before=before,
        after={"state": episode.state, "reason": episode.reason, "exit_code": episode.exit_code},
    )


def episode_command_observed(command: NodeCommand, before: dict) -> None:
    """A node's report moved an episode's start command: its member, then the episode
    (registered with nodes by placement.apps)."""
    if command.kind != CommandKind.START:
        return
    episode_id = (
        Member.objects.filter(command=command, episode__isnull=False)
        .values_list("episode_id", flat=True)
        .first()
    )
    if episode_id is None:
        return
    now = timezone.now()
    episode, members = _locked(episode_id)
    member = next(m for m in members if m.command_id == command.pk)
    moved = {"state": member.state, "reason": member.reason}
    if member.state in RUN_LIVE and command.state == CommandState.RUNNING:
        member.state, member.started_at = RunState.RUNNING, member.started_at or now
    elif member.state in RUN_LIVE and command.state in ENDED_AS:
        member.state, member.reason = ENDED_AS[command.state], command.reason or "vanished"
        member.exit_code, member.ended_at = command.exit_code, now
    member.confinement = command.confinement or member.confinement
    member.save()
    _cleaned(member, command, RUNS, lambda: episode.environment.fleet_id)
    if {"state": member.state, "reason": member.reason} != moved:
        audit_record(
            actor=RUNS,
            action=f"episode_member.{member.state}",
            target=member,
            before=moved,
            after={"state": member.state, "reason": member.reason},
        )
    _settle(episode, member, now)
    _send(CommandKind.CLEANUP, [m for m in members if m.state not in RUN_LIVE], now)


def _settle(episode: Episode, member: Member, now) -> None:
    if episode.state in EPISODE_ENDED:
        return  # timed out or cancelled already: how its process ends changes nothing
    before = {"state": episode.state, "reason": episode.reason}
    if member.state == RunState.RUNNING and episode.state != EpisodeState.RUNNING:
        episode.state, episode.started_at = EpisodeState.RUNNING, now
    elif member.state not in RUN_LIVE:
        succeeded = member.state == RunState.SUCCEEDED
        episode.state = EpisodeState.SUCCEEDED if succeeded else EpisodeState.FAILED
        episode.reason, episode.exit_code = member.reason, member.exit_code
        episode.ended_at = now
    if episode.state != before["state"]:
        _moved(episode, before)


def episodes_time_out(*, now=None) -> dict[str, int]:
    """The beat's pass: every episode past its own timeout — counted from its start, or
    from its placement while it is still starting — ends ``timed_out`` now and its process
    is stopped and cleaned up (S5). Each in a transaction of its own."""
    now = now or timezone.now()
    due = [
        episode_id
        # From its start, or while starting from its placement (its start command's time).
        for episode_id, started_at, placed_at, timeout in Episode.objects.filter(
            state__in=(EpisodeState.STARTING, EpisodeState.RUNNING)
        ).values_list("pk", "started_at", "members__command__created_at", "timeout_seconds")
        if (started_at or placed_at) is not None
        and (started_at or placed_at) + timedelta(seconds=timeout) < now
    ]
    timed_out = 0
    for episode_id in due:
        with transaction.atomic():
            episode, members = _locked(episode_id)
            if episode.state in EPISODE_ENDED:
                continue
            before = {"state": episode.state, "reason": episode.reason}
            episode.state, episode.reason, episode.ended_at = (
                EpisodeState.TIMED_OUT,
                f"timed_out after {episode.timeout_seconds}s (rule S5)",
                now,
            )
            _moved(episode, before)
            live = [m for m in members if m.state in RUN_LIVE]
            _send(CommandKind.STOP, live, now, grace_seconds=_grace())
            timed_out += 1
    return {"timed_out": timed_out}


def episode_output(*, episode: Episode, tail_bytes: int = 65536):
    """The tail of an episode's output, from its node now (nodes.services.logs). A read."""
    member = episode.members.select_related("node").order_by("-pk").first()
    if member is None:
        raise NotFound("The episode has not been placed on a node yet.", field="episode")
    return member, log_tail_fetch(node=member.node, member=member.command_id, tail_bytes=tail_bytes)
