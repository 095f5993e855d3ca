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
from fleets.choices import FleetCapability, FleetKind, FleetState
from nodes.models import NodeCommand
from tuneplane.errors import Conflict
from tuneplane.lifecycle import move

from ..admission import Need, admit_named
from ..choices import EPISODE_ENDED, EPISODE_LIFECYCLE, RUN_LIVE, EpisodeState, RunState
from ..models import Environment, Episode, Member
from ..runspec import checked_episode
from .members import member_follow, members_clean, members_stop
from .passes import allocate_on_commit

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
        # Every gate admission runs, again for each episode: the Fleet still open to the
        # project (F8, else the same 404), still able to env, and its cards fit (P7).
        admit_named(
            environment.project,
            fleet.id,
            Need(
                FleetCapability.ENV,
                cards=run.get("cards") or 0,
                container=bool(run.get("image")),
            ),
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


def episode_member_reported(episode_id: int, command: NodeCommand, before: dict) -> None:
    """A node's report moved an episode's start command: its member follows
    (members.member_follow), then the episode; what ended is cleaned up."""
    now = timezone.now()
    episode, members = _locked(episode_id)
    member = next(m for m in members if m.command_id == command.pk)
    member_follow(
        member, command, before, actor=EPISODES, fleet_id=lambda: episode.environment.fleet_id
    )
    _settle(episode, member, now)
    members_clean(members, now)


def _settle(episode: Episode, member: Member, now) -> None:
    if episode.state in EPISODE_ENDED:
        return  # timed out or cancelled already: how its process ends changes nothing
    if member.state == RunState.RUNNING and episode.state != EpisodeState.RUNNING:
        _move(episode, EpisodeState.RUNNING, reason=episode.reason, started_at=now)
    elif member.state not in RUN_LIVE:
        succeeded = member.state == RunState.SUCCEEDED
        _move(
            episode,
            EpisodeState.SUCCEEDED if succeeded else EpisodeState.FAILED,
            reason=member.reason,
            exit_code=member.exit_code,
            ended_at=now,
        )


def _move(episode: Episode, state: str, *, reason: str, actor: Actor = EPISODES, **fields):
    move(
        episode,
        EPISODE_LIFECYCLE,
        state,
        actor=actor,
        reason=reason[:64],
        fields=fields,
        after={"exit_code": fields.get("exit_code", episode.exit_code)},
    )


def episode_cancel(*, actor: Actor, episode: Episode) -> Episode:
    """A queued episode is cancelled at once; a starting or running one is cancelled now and
    its process stopped (SIGTERM, SIGKILL after the grace) and cleaned up, its cards
    released after the cleanup (R7). One that has ended is a conflict."""
    now = timezone.now()
    with transaction.atomic():
        episode, members = _locked(episode.pk)
        if episode.state in EPISODE_ENDED:
            raise Conflict(
                f"The episode has already ended ({episode.state}); there is nothing to cancel.",
                code="episode_ended",
            )
        _move(episode, EpisodeState.CANCELLED, reason="cancelled", actor=actor, ended_at=now)
        members_stop(members, now)
    return episode


def episodes_time_out(*, now=None) -> dict[str, int]:
    """The beat's pass: every episode past its own timeout ends ``timed_out`` now and its
    process is stopped and cleaned up (S5); each in a transaction of its own. The timeout
    counts from its start; while it is starting, from its placement (its start command's
    time); while it is queued — no node answering for env has room for it — from its
    submission: an episode never waits longer than its own timeout for anything."""
    now = now or timezone.now()
    due = [
        episode_id
        for episode_id, started_at, placed_at, created_at, timeout in Episode.objects.filter(
            state__in=(EpisodeState.QUEUED, EpisodeState.STARTING, EpisodeState.RUNNING)
        ).values_list(
            "pk", "started_at", "members__command__created_at", "created_at", "timeout_seconds"
        )
        if (started_at or placed_at or created_at) + timedelta(seconds=timeout) < now
    ]
    timed_out = 0
    for episode_id in due:
        with transaction.atomic():
            episode, members = _locked(episode_id)
            if episode.state in EPISODE_ENDED:
                continue
            _move(
                episode,
                EpisodeState.TIMED_OUT,
                reason=f"timed_out after {episode.timeout_seconds}s (rule S5)",
                ended_at=now,
            )
            members_stop(members, now)
            timed_out += 1
    return {"timed_out": timed_out}
