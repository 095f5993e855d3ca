"""What waits for cards on a node Fleet, read for the allocator: queued jobs (a gang's
members together), a live revision's missing replicas (S1), a playground session's served
process (S4) and queued episodes (S5).

Each is one ``Waiting`` of its kind: the typed request the pure decision reads
(placement.decide.Request), built once here for every kind, and what the one writer
(placement.services.allocator) needs to write it — the member's owner, its start command's
payload. Every kind's rows are locked for the pass, so a cancel or a stop racing it waits,
and then stops what it placed.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Q, prefetch_related_objects

from audit.services import Actor
from fleets.choices import FleetCapability
from fleets.models import Fleet
from nodes.agent.member.policy import restart_delay

from ..choices import (
    LIFECYCLE_CAPABILITY,
    RUN_LIVE,
    DeploymentState,
    EpisodeState,
    JobState,
    RevisionState,
    RunState,
)
from ..decide import Request
from ..models import (
    Attempt,
    Deployment,
    Episode,
    LifecycleJob,
    Member,
    PlaygroundSession,
    Revision,
    TrainingJob,
)
from .starts import episode_payload, job_payload, replica_payload, session_payload

ALLOCATOR = Actor.system("allocator")
JOB_MODELS = (TrainingJob, LifecycleJob)


@dataclass
class Waiting:
    """One record waiting for cards; ``rank`` is a replica's (a job's ranks are its gang's)."""

    owner: object
    rank: int = 0
    kind = ""  # names it in its requests' keys: trainingjob, replica, session, episode
    capability = ""  # what its Fleet must still promise for it to be placed (F3, R22)

    def request(self, reserve_before: datetime) -> Request:
        raise NotImplementedError

    def member(self, attempt: Attempt | None) -> dict:
        """The member's owner, as Member's fields."""
        raise NotImplementedError

    def payload(
        self, rank: int, cards: list[dict], attempt: Attempt | None, rendezvous, given
    ) -> dict:
        """The start command's payload; ``given``: the (cpus, memory) its node gives (R16)."""
        raise NotImplementedError

    @property
    def fleet(self) -> Fleet:
        return self.owner.fleet

    @property
    def project_id(self) -> int:
        return self.owner.project_id

    def fleet_default(self, key: str):
        """The Fleet's default for what the request does not say (its ``config``, R16)."""
        return (self.fleet.config or {}).get(key)

    def _request(self, reserve_before: datetime, **needs) -> Request:
        owner = self.owner
        return Request(
            key=(self.kind, owner.pk, self.rank),
            order=(owner.created_at, self.kind, owner.pk, self.rank),
            cpus=owner.cpus or self.fleet_default("member_cpus"),
            memory=owner.memory_bytes or self.fleet_default("member_memory_bytes"),
            container=bool(owner.image),
            reserve=owner.created_at <= reserve_before,
            project=self.project_id,
            **needs,
        )


class WaitingJob(Waiting):
    """A queued training or lifecycle job: all its gang's members at once (R3)."""

    @property
    def kind(self) -> str:
        return self.owner._meta.model_name

    @property
    def capability(self) -> str:
        if isinstance(self.owner, LifecycleJob):
            return LIFECYCLE_CAPABILITY[self.owner.kind]
        return FleetCapability.TRAIN

    def request(self, reserve_before: datetime) -> Request:
        job = self.owner
        excluded = job.excluded or {}
        return self._request(
            reserve_before,
            cards=job.cards,
            series=job.series,
            nodes=job.nodes,
            not_before=job.not_before,
            priority=job.priority,
            excluded_nodes=frozenset(e["node"] for e in excluded.get("nodes") or ()),
            excluded_cards=frozenset((e["node"], e["uuid"]) for e in excluded.get("cards") or ()),
        )

    def member(self, attempt: Attempt | None) -> dict:
        return {"attempt": attempt}

    def payload(self, rank, cards, attempt, rendezvous, given) -> dict:
        return job_payload(self.owner, attempt.number, rank, cards, rendezvous, given)


def replica_backoff(failures: int) -> timedelta:
    """How long a replica whose members ended on their own ``failures`` times (refused by
    their node, vanished, lost) waits before it is placed again: the agent's own schedule
    for restarting a replica's process, 1 s doubling to 60."""
    return timedelta(seconds=restart_delay(max(failures - 1, 0)))


@dataclass
class WaitingReplica(Waiting):
    """A live revision's replica that has no live member (S1, S2); placed again only after
    its backoff when its last members ended on their own."""

    kind = "replica"
    capability = FleetCapability.SERVE
    not_before: datetime | None = None

    def request(self, reserve_before: datetime) -> Request:
        revision = self.owner
        return self._request(
            reserve_before,
            cards=revision.deployment.cards,
            series=revision.deployment.series,
            port=revision.port,
            quiet="quiet_serve",
            not_before=self.not_before,
        )

    def member(self, attempt) -> dict:
        return {"revision": self.owner, "port": self.owner.port}

    def payload(self, rank, cards, attempt, rendezvous, given) -> dict:
        return replica_payload(self.owner, self.rank, cards, given)

    @property
    def fleet(self) -> Fleet:
        return self.owner.deployment.fleet

    @property
    def project_id(self) -> int:
        return self.owner.deployment.project_id


class WaitingSession(Waiting):
    """A live playground session without its process (S4)."""

    kind = "session"
    capability = FleetCapability.SERVE

    def request(self, reserve_before: datetime) -> Request:
        session = self.owner
        return self._request(
            reserve_before,
            cards=session.cards,
            series=session.series,
            port=session.port,
            quiet="quiet_serve",
        )

    def member(self, attempt) -> dict:
        return {"session": self.owner, "port": self.owner.port}

    def payload(self, rank, cards, attempt, rendezvous, given) -> dict:
        return session_payload(self.owner, cards, given)


class WaitingEpisode(Waiting):
    """A queued episode: on a node answering for env now (S5, S6), any card."""

    kind = "episode"
    capability = FleetCapability.ENV

    def request(self, reserve_before: datetime) -> Request:
        return self._request(reserve_before, cards=self.owner.cards, quiet="quiet_env")

    def member(self, attempt) -> dict:
        return {"episode": self.owner}

    def payload(self, rank, cards, attempt, rendezvous, given) -> dict:
        return episode_payload(self.owner, cards, given)

    @property
    def fleet(self) -> Fleet:
        return self.owner.environment.fleet

    @property
    def project_id(self) -> int:
        return self.owner.environment.project_id


def waiting(fleet: Fleet) -> list[Waiting]:
    """Everything of the Fleet that waits for cards, its rows locked for the pass: a fixed
    number of queries."""
    return _jobs(fleet) + _replicas(fleet) + _sessions(fleet) + _episodes(fleet)


def _jobs(fleet: Fleet) -> list[WaitingJob]:
    """The Fleet's queued jobs of both kinds: one query a kind."""
    return [
        WaitingJob(job)
        for model in JOB_MODELS
        for job in model.objects.filter(
            fleet=fleet, state=JobState.QUEUED, cancel_requested_at__isnull=True
        )
        # Locked: a cancel racing this pass either comes first (and the job is not here)
        # or waits for it (and then stops what it started).
        .select_for_update(of=("self",))
        .select_related("fleet", "project")
        .defer(*RUN_FIELDS)
        .order_by("created_at", "id")
    ]


# What a job runs: read for the jobs a pass places only (run_fields_load), never for the
# whole queue — a pass's bytes stay bounded by its jobs' few numbers, not their scripts.
RUN_FIELDS = ("command", "script", "env", "admission", "backend_error")


def run_fields_load(items: list[Waiting]) -> None:
    """The run fields and storage of the placed jobs, onto their rows: a query a kind and
    two for their volumes and datasets, however many."""
    for model in JOB_MODELS:
        jobs = {
            i.owner.pk: i.owner
            for i in items
            if isinstance(i, WaitingJob) and isinstance(i.owner, model)
        }
        if not jobs:
            continue
        for row in model.objects.filter(pk__in=jobs).values("pk", *RUN_FIELDS):
            for field in RUN_FIELDS:
                setattr(jobs[row["pk"]], field, row[field])
        prefetch_related_objects(list(jobs.values()), "volumes", "datasets")


def _replicas(fleet: Fleet) -> list[WaitingReplica]:
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


def _lacking(deployments) -> list[WaitingReplica]:
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
    failed: dict[tuple[int, int], list] = {}
    for revision_id, rank, state, ended_at in Member.objects.filter(
        revision__in=revisions
    ).values_list("revision_id", "rank", "state", "ended_at"):
        if state in RUN_LIVE:
            taken.setdefault(revision_id, set()).add(rank)
        elif state in ENDED_ON_ITS_OWN and ended_at is not None:
            failed.setdefault((revision_id, rank), []).append(ended_at)
    return [
        WaitingReplica(revision, rank, not_before=_backed_off(failed.get((revision.pk, rank))))
        for revision in revisions
        for rank in range(revision.replicas)
        if rank not in taken.get(revision.pk, set())
    ]


# A replica's member that ended without being asked to: its node refused it, or it vanished
# or was lost with its node.
ENDED_ON_ITS_OWN = (RunState.FAILED, RunState.LOST)


def _backed_off(ended: list | None) -> datetime | None:
    return max(ended) + replica_backoff(len(ended)) if ended else None


# A playground session waits for cards while it is live and has no process (S4): the one
# definition the pass, the beat's safety net and the metrics read.
SESSION_WAITS = Q(state=DeploymentState.LIVE, port__isnull=False, members__isnull=True)


def _sessions(fleet: Fleet) -> list[WaitingSession]:
    sessions = (
        PlaygroundSession.objects.filter(SESSION_WAITS, fleet=fleet)
        .select_for_update(of=("self",))
        .select_related("fleet")
        .order_by("pk")
    )
    return [WaitingSession(session) for session in sessions]


def _episodes(fleet: Fleet) -> list[WaitingEpisode]:
    episodes = (
        Episode.objects.filter(environment__fleet=fleet, state=EpisodeState.QUEUED)
        .select_for_update(of=("self",))
        .select_related("environment__fleet")
        .order_by("pk")
    )
    return [WaitingEpisode(episode) for episode in episodes]


def member_kind(member: Member) -> str:
    """The word its audit events use: a job's member, a replica, a session's or an episode's."""
    if member.revision_id:
        return "replica"
    if member.session_id:
        return "session_member"
    return "episode_member" if member.episode_id else "member"


def member_view(member: Member) -> dict:
    """A placed member as its creation's audit event shows it."""
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


# How many changes of a record's reason to wait are kept (Q8): the newest.
WAIT_HISTORY = 50


def waits_record(items: dict[tuple, Waiting], waits: dict, now) -> None:
    """Q8: why each request of the pass waits, on its owner — a job, a session or an
    episode; a revision by replica rank — with since when (kept while the reason stays) and
    each change of reason (a revision's with its replica's rank). Only what changed is
    written: a statement a kind."""
    changed: dict = {}
    for key, wait in waits.items():
        item = items.get(key)
        if item is None:
            continue
        record, owner = wait.as_record(), item.owner
        if isinstance(item, WaitingReplica):
            rank, before = str(item.rank), owner.waiting.get(str(item.rank))
            shown = _since(before, record, now)
            if shown != before:
                owner.waiting = {**owner.waiting, rank: shown}
                if not before or before["reason"] != record["reason"]:
                    change = {"rank": item.rank, "at": shown["since"], "reason": record["reason"]}
                    owner.waiting_history = [*owner.waiting_history, change][-WAIT_HISTORY:]
                changed.setdefault(Revision, {})[owner.pk] = owner
            continue
        shown = _since(owner.waiting, record, now)
        if shown == owner.waiting:
            continue
        if not owner.waiting or owner.waiting["reason"] != record["reason"]:
            change = {"at": shown["since"], "reason": record["reason"]}
            owner.waiting_history = [*owner.waiting_history, change][-WAIT_HISTORY:]
        owner.waiting = shown
        changed.setdefault(type(owner), {})[owner.pk] = owner
    for model, owners in changed.items():
        model.objects.bulk_update(list(owners.values()), ["waiting", "waiting_history"])


def _since(current: dict | None, record: dict, now) -> dict:
    kept = current and current.get("reason") == record["reason"]
    return {**record, "since": current["since"] if kept else now.isoformat()}
