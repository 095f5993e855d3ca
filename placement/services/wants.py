"""What a node Fleet's allocator places besides jobs: a live revision's replicas (S1), a
playground session's served process (S4) and an episode (S5) — each one member on one node
with its cards (and, when it serves, a port no other member on that node uses).

The allocator (allocator.py) takes them in the same pass and admission order as jobs. Each
kind's rows are locked for the pass, so a stop racing it waits and then stops what it placed.
"""

from dataclasses import dataclass

from audit.services import Actor, audit_record_each
from fleets.models import Fleet
from nodes.choices import CommandKind
from nodes.services.commands import node_commands_create_many

from ..choices import RUN_LIVE, DeploymentState, EpisodeState, RevisionState
from ..models import CardHold, Deployment, Episode, Member, PlaygroundSession, Revision
from .payloads import episode_payload, replica_payload, session_payload

ALLOCATOR = Actor.system("allocator")


@dataclass
class Want:
    """One member to place: the job-like fields the allocator reads, and how to write it."""

    owner: object
    rank: int = 0
    nodes = 1
    not_before = None
    quiet = "quiet_serve"  # the capability whose quiet keeps a node off it

    @property
    def series(self) -> str:
        return self.owner.series

    @property
    def cards(self) -> int:
        return self.owner.cards

    def __getattr__(self, name):  # cpus, memory_bytes, port, image, created_at: the owner's
        if name in ("cpus", "memory_bytes", "port", "image", "created_at"):
            return getattr(self.owner, name)
        raise AttributeError(name)

    @property
    def sort_key(self):
        return (type(self).__name__, self.owner.pk, self.rank)


class ReplicaWant(Want):
    @property
    def series(self) -> str:
        return self.owner.deployment.series

    @property
    def cards(self) -> int:
        return self.owner.deployment.cards

    def member(self) -> dict:
        return {"revision": self.owner}

    def payload(self, cards) -> dict:
        return replica_payload(self.owner, self.rank, cards)


class SessionWant(Want):
    def member(self) -> dict:
        return {"session": self.owner}

    def payload(self, cards) -> dict:
        return session_payload(self.owner, cards)


class EpisodeWant(Want):
    quiet = "quiet_env"  # S5: a node answering for env now
    port = None
    series = ""

    @property
    def cards(self) -> int:
        return self.owner.cards

    def member(self) -> dict:
        return {"episode": self.owner}

    def payload(self, cards) -> dict:
        return episode_payload(self.owner, cards)


def wanted(fleet: Fleet) -> list[Want]:
    """Every member the Fleet's replicas, sessions and episodes still lack, their rows
    locked for the pass: a fixed number of queries."""
    return _replicas(fleet) + _sessions(fleet) + _episodes(fleet)


def _replicas(fleet: Fleet) -> list[ReplicaWant]:
    """Read first without locks; then only the deployments that lack replicas are locked
    and read again: a pass never makes the reports of a whole Fleet's replicas wait."""
    live = Deployment.objects.filter(fleet=fleet, state=DeploymentState.LIVE).values("pk")
    lacking = {want.owner.deployment_id for want in _lacking(live)}
    if not lacking:
        return []
    locked = (
        Deployment.objects.filter(pk__in=lacking, state=DeploymentState.LIVE)
        .select_for_update(of=("self",))
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    return _lacking(list(locked))


def _lacking(deployments) -> list[ReplicaWant]:
    # Each deployment's newest live revision: a rollout's old one gets no new replicas, and
    # one rolled back to has the replicas its rollout stopped placed again (S2).
    newest = {
        revision.deployment_id: revision
        for revision in Revision.objects.filter(
            deployment_id__in=deployments, state=RevisionState.LIVE, port__isnull=False
        )
        .select_related("deployment__fleet")
        .order_by("deployment_id", "number")
    }
    revisions = list(newest.values())
    taken: dict[int, set[int]] = {}
    for revision_id, rank in Member.objects.filter(
        revision__in=revisions, state__in=RUN_LIVE
    ).values_list("revision_id", "rank"):
        taken.setdefault(revision_id, set()).add(rank)
    return [
        ReplicaWant(revision, rank)
        for revision in revisions
        for rank in range(revision.replicas)
        if rank not in taken.get(revision.pk, set())
    ]


def _sessions(fleet: Fleet) -> list[SessionWant]:
    sessions = (
        PlaygroundSession.objects.filter(
            fleet=fleet, state=DeploymentState.LIVE, port__isnull=False, members__isnull=True
        )
        .select_for_update(of=("self",))
        .select_related("fleet")
        .order_by("pk")
    )
    return [SessionWant(session) for session in sessions]


def _episodes(fleet: Fleet) -> list[EpisodeWant]:
    episodes = (
        Episode.objects.filter(environment__fleet=fleet, state=EpisodeState.QUEUED)
        .select_for_update(of=("self",))
        .select_related("environment__fleet")
        .order_by("pk")
    )
    return [EpisodeWant(episode) for episode in episodes]


def write_wants(decided) -> None:
    """Each placed member: its start command, its member and held cards, audited (A1); a
    placed episode is starting."""
    commands = [
        (capacity.node_id, CommandKind.START, want.payload(cards))
        for want, [(capacity, cards)] in decided
    ]
    created = node_commands_create_many(actor=ALLOCATOR, commands=commands)
    members = Member.objects.bulk_create(
        [
            Member(
                **want.member(),
                rank=want.rank,
                node_id=capacity.node_id,
                command=command,
                cards=cards,
                cpus=want.cpus,
                memory_bytes=want.memory_bytes,
                port=want.port,
            )
            for (want, [(capacity, cards)]), command in zip(decided, created, strict=True)
        ]
    )
    CardHold.objects.bulk_create(
        [
            CardHold(node_id=member.node_id, index=card["index"], uuid=card["uuid"], member=member)
            for member in members
            for card in member.cards
        ]
    )
    episodes = [want.owner for want, _ in decided if isinstance(want, EpisodeWant)]
    for episode in episodes:
        episode.state = EpisodeState.STARTING
    Episode.objects.bulk_update(episodes, ["state"])
    audit_record_each(
        actor=ALLOCATOR,
        target_type="placement.member",
        events=[(f"{_kind(m)}.created", m.pk, None, member_view(m)) for m in members],
    )
    audit_record_each(
        actor=ALLOCATOR,
        target_type="placement.episode",
        events=[
            ("episode.starting", e.pk, {"state": EpisodeState.QUEUED}, {"state": e.state})
            for e in episodes
        ],
    )


def _kind(member: Member) -> str:
    if member.revision_id:
        return "replica"
    return "session_member" if member.session_id else "episode_member"


def member_view(member: Member) -> dict:
    owner = {
        key: value
        for key, value in (
            ("revision", member.revision_id),
            ("session", member.session_id),
            ("episode", member.episode_id),
        )
        if value
    }
    return {
        **owner,
        "attempt": member.attempt_id,
        "rank": member.rank,
        "node": member.node_id,
        "cards": member.cards,
        "state": member.state,
        "command": member.command_id,
    }
