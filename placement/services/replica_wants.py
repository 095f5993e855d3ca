"""The replicas a node Fleet's live revisions still lack, and what placing them writes (S1).

The allocator (allocator.py) takes them in the same pass and order as jobs: each replica is
one node with its cards and its port, which no other replica on that node may use.
"""

from dataclasses import dataclass

from audit.services import Actor, audit_record_each
from fleets.models import Fleet
from nodes.choices import CommandKind
from nodes.services.commands import node_commands_create_many

from ..choices import DeploymentState, RevisionState
from ..models import CardHold, Deployment, Member, Revision
from .payloads import replica_payload

ALLOCATOR = Actor.system("allocator")


@dataclass
class ReplicaWant:
    """A live revision's replica not yet placed: one node, its cards, its port (S1)."""

    revision: Revision
    rank: int

    def __getattr__(self, name):  # series, cards, cpus, memory_bytes, port: the revision's
        source = self.revision.deployment if name in ("series", "cards") else self.revision
        return getattr(source, name)

    nodes = 1
    not_before = None

    @property
    def created_at(self):
        return self.revision.created_at

    @property
    def sort_key(self):
        return ("~replica", self.revision.pk, self.rank)


def replicas_wanted(fleet: Fleet) -> list[ReplicaWant]:
    """The replicas live revisions on the Fleet still lack, their deployments locked for the
    pass (a stop racing it waits, then stops what it placed): three queries."""
    wanting = Revision.objects.filter(
        deployment__fleet=fleet,
        deployment__state=DeploymentState.LIVE,
        state=RevisionState.LIVE,
        port__isnull=False,
    ).values("deployment_id")
    deployments = (
        Deployment.objects.filter(pk__in=wanting)
        .select_for_update(of=("self",))
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    revisions = list(
        Revision.objects.filter(
            deployment_id__in=list(deployments), state=RevisionState.LIVE, port__isnull=False
        ).select_related("deployment__fleet")
    )
    taken: dict[int, set[int]] = {}
    for revision_id, rank in Member.objects.filter(revision__in=revisions).values_list(
        "revision_id", "rank"
    ):
        taken.setdefault(revision_id, set()).add(rank)
    return [
        ReplicaWant(revision, rank)
        for revision in revisions
        for rank in range(revision.replicas)
        if rank not in taken.get(revision.pk, set())
    ]


def write_replicas(decided) -> None:
    """Each placed replica: its start command, its member and held cards, audited (A1)."""
    commands = [
        (capacity.node_id, CommandKind.START, replica_payload(want.revision, want.rank, cards))
        for want, [(capacity, cards)] in decided
    ]
    created = node_commands_create_many(actor=ALLOCATOR, commands=commands)
    members = Member.objects.bulk_create(
        [
            Member(
                revision=want.revision,
                rank=want.rank,
                node_id=capacity.node_id,
                command=command,
                cards=cards,
                cpus=want.revision.cpus,
                memory_bytes=want.revision.memory_bytes,
                port=want.revision.port,
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
    audit_record_each(
        actor=ALLOCATOR,
        target_type="placement.member",
        events=[("replica.created", m.pk, None, member_view(m)) for m in members],
    )


def member_view(member: Member) -> dict:
    return {
        **({"revision": member.revision_id} if member.revision_id else {}),
        "attempt": member.attempt_id,
        "rank": member.rank,
        "node": member.node_id,
        "cards": member.cards,
        "state": member.state,
        "command": member.command_id,
    }
