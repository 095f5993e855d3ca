"""Workload records. Every admitted one keeps the Fleet it was admitted against (PROTECT)."""

import functools
import operator

from django.conf import settings
from django.db import models

from fleets.models import Fleet
from nodes.models import Node
from tuneplane.models import Project

from .choices import (
    RUN_LIVE,
    Cleanup,
    DeploymentState,
    EndClass,
    EpisodeState,
    JobState,
    LifecycleKind,
    RevisionState,
    RunState,
)


class StorageRecord(models.Model):
    """Volumes and datasets are storage: never placed, they reach a job through its Fleet's
    delivery (P3)."""

    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="+")
    name = models.SlugField(max_length=63)
    # Where an object-pull Fleet's node fetches it from.
    uri = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True
        ordering = ["project_id", "name"]

    def __str__(self) -> str:
        return f"{self.project.slug}/{self.name}"


class Volume(StorageRecord):
    class Meta(StorageRecord.Meta):
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="one_volume_name_per_project")
        ]


class Dataset(StorageRecord):
    class Meta(StorageRecord.Meta):
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="one_dataset_name_per_project")
        ]


class Workload(models.Model):
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="+")
    # The Fleet it was admitted against: it never changes, and it keeps the Fleet alive.
    fleet = models.ForeignKey(Fleet, on_delete=models.PROTECT, related_name="+")
    name = models.CharField(max_length=200)
    series = models.SlugField(max_length=63, blank=True)
    cards = models.PositiveIntegerField(default=0)
    nodes = models.PositiveIntegerField(default=1)
    admission = models.JSONField(default=dict)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} on {self.fleet_id}"


class Job(Workload):
    """What a job runs and how it is going. On a node Fleet the allocator gives its attempts
    cards and the agents run them (DESIGN §7); a cluster Fleet's manager runs its script."""

    # A node Fleet's job runs ``command`` (argv) or ``script`` (by /bin/bash); a cluster
    # Fleet's manager runs the script (a batch script for Slurm, an entrypoint for Ray).
    command = models.JSONField(default=list, blank=True)
    script = models.TextField(blank=True)
    # A container image to run it in (on a node with a container runtime); "": a process.
    image = models.CharField(max_length=255, blank=True)
    env = models.JSONField(default=dict, blank=True)
    cpus = models.FloatField(null=True, blank=True)
    memory_bytes = models.BigIntegerField(null=True, blank=True)
    # R9, H3: the attempts its own ends (user) may spend, retries included; and the exit codes
    # that mean "try again" (retry.on_exit_codes): any other non-zero exit fails it at once.
    max_attempts = models.PositiveSmallIntegerField(default=3)
    retry_on_exit_codes = models.JSONField(default=list, blank=True)
    # H2: the nodes and cards an infrastructure end of one of its attempts was laid to; its
    # next attempts are never placed there until an operator clears it:
    # {"nodes": [{"node", "reason", "attempt", "at"}], "cards": [{"node", "index", "uuid", …}]}.
    excluded = models.JSONField(default=dict, blank=True)
    # Q3: within its project, a higher priority is placed first (capped by the project's
    # max_priority); Q4: whether it may be preempted while within its project's guarantee.
    priority = models.IntegerField(default=0)
    preemptible = models.BooleanField(default=False)
    # Q6: the grace its members get between SIGTERM and SIGKILL when preempted, if it asks
    # for less than TUNEPLANE_PREEMPT_GRACE; and its last preemption: by whom, why, when and
    # the deadline its members were given ({"by": …, "why": …, "at": …, "deadline": …}).
    preemption_grace_seconds = models.PositiveIntegerField(null=True, blank=True)
    preemption = models.JSONField(null=True, blank=True)
    # Q8: why it waits, as the allocator's last pass decided (shown while queued), and each
    # change of reason: [{"at": …, "reason": …}].
    waiting = models.JSONField(null=True, blank=True)
    waiting_history = models.JSONField(default=list, blank=True)
    # A gang's members must all run within this of allocation (R3); None: the setting's.
    gang_deadline_seconds = models.PositiveIntegerField(null=True, blank=True)
    state = models.CharField(
        max_length=16, choices=JobState.choices, default=JobState.QUEUED, db_index=True
    )
    reason = models.CharField(max_length=64, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # A retry after a missed gang deadline or an infrastructure end (H2) waits a backoff:
    # not allocated before this.
    not_before = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # The manager's own record of it, once handed over: its id, its state in its words, and
    # why handing it over failed, if it did. On a cluster Fleet the manager
    # is the allocator (P7).
    backend_job_id = models.CharField(max_length=200, blank=True)
    backend_state = models.CharField(max_length=32, blank=True)
    backend_error = models.TextField(blank=True)
    # Handing over: the key the manager knows the job by (a Slurm comment, part of a RayJob's
    # name), kept from the first attempt, and when the attempt under way began. A crash
    # between the manager's answer and our commit is resumed under the same key, so the job
    # is found, not submitted twice.
    handover_key = models.CharField(max_length=32, blank=True)
    handover_started_at = models.DateTimeField(null=True, blank=True)
    # A cancel passed on to the manager (R10): sent once; its end is read back as any state.
    backend_cancel_sent_at = models.DateTimeField(null=True, blank=True)

    class Meta(Workload.Meta):
        abstract = True


class TrainingJob(Job):
    volumes = models.ManyToManyField(Volume, blank=True, related_name="+")
    datasets = models.ManyToManyField(Dataset, blank=True, related_name="+")


class LifecycleJob(Job):
    kind = models.CharField(max_length=16, choices=LifecycleKind.choices)
    volumes = models.ManyToManyField(Volume, blank=True, related_name="+")
    datasets = models.ManyToManyField(Dataset, blank=True, related_name="+")


class ServeSpec(models.Model):
    """What a served member runs (S1): a replica's revision, a playground session."""

    command = models.JSONField(default=list, blank=True)
    script = models.TextField(blank=True)
    # A container image to run it in (on a node with a container runtime); "": a process.
    image = models.CharField(max_length=255, blank=True)
    env = models.JSONField(default=dict, blank=True)
    port = models.PositiveIntegerField(null=True, blank=True)
    readiness_path = models.CharField(max_length=200, default="/health")
    cpus = models.FloatField(null=True, blank=True)
    memory_bytes = models.BigIntegerField(null=True, blank=True)

    class Meta:
        abstract = True


class Deployment(Workload):
    state = models.CharField(
        max_length=16, choices=DeploymentState.choices, default=DeploymentState.LIVE
    )
    # Why it reads as it does beyond its replicas: a rollout rolled back, say (S2).
    reason = models.CharField(max_length=300, blank=True)


class Revision(ServeSpec, models.Model):
    """One version of a deployment. On a node Fleet it is what to serve — a command or
    script, its env, the port it listens on and its readiness path — and ``replicas``
    members the allocator places, each a long-running process the agent restarts and probes
    (S1). Elsewhere it is a record on the node admission chose. Ready is never stored as a
    whole: placement.selectors computes it from the node's liveness (L2) and, on a node
    Fleet, from each replica's reported readiness."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField()
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.PROTECT, related_name="revisions"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    state = models.CharField(
        max_length=16, choices=RevisionState.choices, default=RevisionState.LIVE
    )
    reason = models.CharField(max_length=300, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # What each replica runs (ServeSpec, node Fleets: placement.runspec.checked_serve).
    replicas = models.PositiveSmallIntegerField(default=1)
    # Q8: why each replica without a member waits, by rank ("0", "1", …).
    waiting = models.JSONField(default=dict, blank=True)
    # Q8: each change of a replica's reason to wait: [{"rank": …, "at": …, "reason": …}].
    waiting_history = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["deployment_id", "number"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "number"], name="one_revision_number")
        ]


class PlaygroundSession(ServeSpec, Workload):
    """On a node Fleet, one served member like a replica, for a lifetime: at ``ends_at`` it
    is stopped and cleaned (S4); ended early on request."""

    state = models.CharField(
        max_length=16, choices=DeploymentState.choices, default=DeploymentState.LIVE
    )
    reason = models.CharField(max_length=200, blank=True)
    ends_at = models.DateTimeField(null=True, blank=True)
    waiting = models.JSONField(null=True, blank=True)  # Q8, while it has no member
    waiting_history = models.JSONField(default=list, blank=True)

    class Meta(Workload.Meta):
        pass


class Environment(Workload):
    manifest = models.JSONField(default=dict)


class Episode(models.Model):
    """One run in an environment (S5): a member on a node of its Fleet answering for env
    now, with its own timeout; quiet for env never fails it (S6)."""

    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="episodes")
    number = models.PositiveIntegerField()
    command = models.JSONField(default=list, blank=True)
    script = models.TextField(blank=True)
    # A container image to run it in (on a node with a container runtime); "": a process.
    image = models.CharField(max_length=255, blank=True)
    env = models.JSONField(default=dict, blank=True)
    cards = models.PositiveIntegerField(default=0)
    cpus = models.FloatField(null=True, blank=True)
    memory_bytes = models.BigIntegerField(null=True, blank=True)
    timeout_seconds = models.PositiveIntegerField()
    state = models.CharField(
        max_length=16, choices=EpisodeState.choices, default=EpisodeState.QUEUED
    )
    reason = models.CharField(max_length=64, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    waiting = models.JSONField(null=True, blank=True)  # Q8, while queued
    waiting_history = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["environment_id", "number"]
        constraints = [
            models.UniqueConstraint(fields=["environment", "number"], name="one_episode_number")
        ]

    def __str__(self) -> str:
        return f"episode {self.number} of {self.environment}"


class Attempt(models.Model):
    """One try at a job: its members hold cards from allocation until their cleanup (R7)."""

    training_job = models.ForeignKey(
        TrainingJob, null=True, blank=True, on_delete=models.CASCADE, related_name="attempts"
    )
    lifecycle_job = models.ForeignKey(
        LifecycleJob, null=True, blank=True, on_delete=models.CASCADE, related_name="attempts"
    )
    fleet = models.ForeignKey(Fleet, on_delete=models.PROTECT, related_name="+")
    number = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=16, choices=RunState.choices, default=RunState.STARTING)
    reason = models.CharField(max_length=64, blank=True)
    # H1: whose its end was — the machine's or the job's own (placement.faults decides).
    end_class = models.CharField(max_length=16, choices=EndClass.choices, blank=True)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                name="attempt_of_one_job",
                condition=models.Q(training_job__isnull=False, lifecycle_job__isnull=True)
                | models.Q(training_job__isnull=True, lifecycle_job__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.job}"

    @property
    def job(self):
        return self.training_job if self.training_job_id else self.lifecycle_job

    @staticmethod
    def job_field(job_or_model) -> str:
        """The attempt's field naming a job of that kind."""
        model = job_or_model if isinstance(job_or_model, type) else type(job_or_model)
        return "training_job" if issubclass(model, TrainingJob) else "lifecycle_job"


OWNERS = ("attempt", "revision", "session", "episode")
# A member is of exactly one attempt, revision, playground session or episode.
_ONE_OWNER = functools.reduce(
    operator.or_,
    (models.Q(**{f"{owner}__isnull": owner != mine for owner in OWNERS}) for mine in OWNERS),
)


class Member(models.Model):
    """One node's part of an attempt — or one replica of a deployment's revision: a process
    there, holding specific cards (R1, R4) until its node confirms its cleanup (R7)."""

    attempt = models.ForeignKey(
        Attempt, null=True, blank=True, on_delete=models.CASCADE, related_name="members"
    )
    revision = models.ForeignKey(
        Revision, null=True, blank=True, on_delete=models.CASCADE, related_name="members"
    )
    session = models.ForeignKey(
        PlaygroundSession, null=True, blank=True, on_delete=models.CASCADE, related_name="members"
    )
    episode = models.ForeignKey(
        Episode, null=True, blank=True, on_delete=models.CASCADE, related_name="members"
    )
    rank = models.PositiveSmallIntegerField()
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="members")
    # The node's start command: the agent reports the member's state as that command's.
    command = models.OneToOneField(
        "nodes.NodeCommand", on_delete=models.PROTECT, related_name="member"
    )
    cards = models.JSONField(default=list)  # [{"index": 0, "uuid": "GPU-…"}, …]
    cpus = models.FloatField(null=True, blank=True)
    memory_bytes = models.BigIntegerField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=RunState.choices, default=RunState.STARTING)
    reason = models.CharField(max_length=64, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    confinement = models.CharField(max_length=200, blank=True)
    cleanup = models.CharField(max_length=16, choices=Cleanup.choices, default=Cleanup.PENDING)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    cleanup_requested_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # H4: when its node last saw it mark a checkpoint; None: it never has.
    checkpointed_at = models.DateTimeField(null=True, blank=True)
    # Q1: whose cards these are, and the quota they count against (its series, "" any
    # card); borrowed: placed beyond the project's guarantee (Q3, Q4).
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    quota_series = models.SlugField(max_length=63, blank=True)
    borrowed = models.BooleanField(default=False)
    # A replica's (S1): the port it serves on, whether the agent's probe passes, how often
    # the agent restarted it, and the probe's last error or why it restarts.
    port = models.PositiveIntegerField(null=True, blank=True)
    ready = models.BooleanField(default=False)
    restarts = models.PositiveIntegerField(default=0)
    detail = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["attempt_id", "revision_id", "rank"]
        constraints = [
            models.UniqueConstraint(fields=["attempt", "rank"], name="one_member_per_rank"),
            # A replica's rank is one live member at a time; a stopped one may be placed
            # again (a revision rolled back to, S2).
            models.UniqueConstraint(
                fields=["revision", "rank"],
                condition=models.Q(state__in=RUN_LIVE),
                name="one_live_replica_per_rank",
            ),
            models.CheckConstraint(name="member_of_one_owner", condition=_ONE_OWNER),
        ]

    def __str__(self) -> str:
        if self.revision_id:
            return f"replica {self.rank} of revision {self.revision_id} on {self.node_id}"
        return f"rank {self.rank} of {self.attempt} on {self.node_id}"

    @property
    def fleet_id(self) -> str:
        if self.attempt_id:
            return self.attempt.fleet_id
        if self.revision_id:
            return self.revision.deployment.fleet_id
        if self.session_id:
            return self.session.fleet_id
        return self.episode.environment.fleet_id


class CardHold(models.Model):
    """A card given to a member, from allocation until the node confirms its cleanup (R7).
    One row a card: the database itself refuses one card to two members (R1)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="card_holds")
    index = models.PositiveIntegerField()
    uuid = models.CharField(max_length=200)
    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="holds")
    # The card's hardware series as the pass that gave it read it ("" not mapped): what the
    # cards held by series are counted by (tuneplane_gpu_cards_series).
    series = models.SlugField(max_length=63, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="one_hold_per_card"),
        ]

    def __str__(self) -> str:
        return f"card {self.index} of {self.node_id} held by {self.member_id}"


class Quota(models.Model):
    """Q1: a project's share of a node Fleet's cards of one series ("" any card): the cards
    it is guaranteed, the most it may hold (None: unlimited) and its weight in fair share.
    A Fleet without quotas is first come, first served; a project without a quota on a Fleet
    that has quotas is guaranteed 0, unlimited, weight 1."""

    fleet = models.ForeignKey(Fleet, on_delete=models.CASCADE, related_name="quotas")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    series = models.SlugField(max_length=63, blank=True)
    guaranteed = models.PositiveIntegerField(default=0)
    limit = models.PositiveIntegerField(null=True, blank=True)
    weight = models.PositiveIntegerField(default=1)

    class Meta:
        ordering = ["fleet_id", "project__slug", "series"]
        constraints = [
            models.UniqueConstraint(
                fields=["fleet", "project", "series"], name="quota_one_per_series"
            ),
            models.CheckConstraint(
                condition=models.Q(limit__isnull=True)
                | models.Q(limit__gte=models.F("guaranteed")),
                name="quota_limit_at_least_guaranteed",
            ),
            models.CheckConstraint(condition=models.Q(weight__gte=1), name="quota_weight_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.project} on {self.fleet_id} ({self.series or 'any card'})"


class Usage(models.Model):
    """Q3: a project's use of a node Fleet's cards, in card-seconds decayed with the fair
    share half-life, as of a time: brought forward by each allocator pass."""

    fleet = models.ForeignKey(Fleet, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    card_seconds = models.FloatField(default=0.0)
    as_of = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["fleet", "project"], name="usage_one_per_project")
        ]
