from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from tuneplane.permissions import is_admin

from ..choices import (
    Cleanup,
    DeploymentState,
    DeploymentStatus,
    EndClass,
    EpisodeState,
    JobState,
    RevisionState,
    RunState,
)
from ..disclosure import preemption_shown, wait_shown
from ..faults import infra_retries_of, work_lost
from ..models import (
    Attempt,
    Dataset,
    Deployment,
    Environment,
    Episode,
    LifecycleJob,
    Member,
    PlaygroundSession,
    Revision,
    TrainingJob,
    Volume,
)
from ..selectors import delivery_of, projects_read_by, replica_not_ready, replica_ready
from ..services.starts import host
from ..waits import REASONS as WAIT_REASONS


def _sees(serializer):
    """The reader's predicate on projects (the context's ``viewer``): read once an answer,
    however many records it shows (a list's records share their root's context)."""
    context = serializer.context
    if "sees" not in context:
        context["sees"] = projects_read_by(context.get("viewer"))
    return context["sees"]


class ShownToReader:
    """R23: a record's reason to wait and its last preemption name other projects' work only
    as "another project's work" (placement.disclosure) to a reader who does not read those
    projects — a member of this one only; administrators read every name."""

    def to_representation(self, instance):
        data = super().to_representation(instance)
        sees = _sees(self)
        if data.get("preemption"):
            shown = preemption_shown(instance.preemption, sees)
            data["preemption"] = {key: shown[key] for key in data["preemption"]}
        waiting = data.get("waiting")
        if waiting and "reason" in waiting:
            data["waiting"] = wait_shown(waiting, sees)
        elif waiting:  # a revision's, by replica rank
            data["waiting"] = {rank: wait_shown(wait, sees) for rank, wait in waiting.items()}
        return data


class WorkloadSerializer(ShownToReader, serializers.ModelSerializer):
    project = serializers.CharField(source="project.slug")
    fleet = serializers.CharField(source="fleet_id")
    created_by = serializers.CharField(source="created_by.username", allow_null=True, default=None)
    admission = serializers.SerializerMethodField(
        help_text="The gates passed and how many nodes the need fitted on; administrators "
        "also see which (fits_on)."
    )

    class Meta:
        fields = [
            "id",
            "project",
            "name",
            "fleet",
            "series",
            "cards",
            "nodes",
            "admission",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.DictField())
    def get_admission(self, workload) -> dict:
        """Node ids are an administrator's to read (the nodes API is theirs): a member
        learns how many nodes fitted, never which."""
        record = dict(workload.admission)
        fits_on = record.pop("fits_on", [])
        record["fits_on_nodes"] = len(fits_on)
        if is_admin(self.context.get("viewer")):
            record["fits_on"] = fits_on
        return record


class MemberSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node_id", read_only=True)
    state = serializers.ChoiceField(choices=RunState.choices, read_only=True)
    cleanup = serializers.ChoiceField(choices=Cleanup.choices, read_only=True)
    cards = serializers.ListField(child=serializers.DictField(), read_only=True)

    class Meta:
        model = Member
        fields = [
            "rank",
            "node",
            "cards",
            "state",
            "reason",
            "exit_code",
            "confinement",
            "cleanup",
            "started_at",
            "ended_at",
            "checkpointed_at",
        ]
        read_only_fields = fields


class AttemptSerializer(serializers.ModelSerializer):
    state = serializers.ChoiceField(choices=RunState.choices, read_only=True)
    end_class = serializers.ChoiceField(
        choices=[("", ""), *EndClass.choices],
        read_only=True,
        help_text="H1: whose its end was — infrastructure (the machine's: it never spends "
        "max_attempts) or user (the job's own); empty while it runs, or when preempted.",
    )
    members = MemberSerializer(many=True, read_only=True)
    work_lost_seconds = serializers.SerializerMethodField(
        help_text="H4: for an attempt that ended without succeeding, what it ran since its "
        "last checkpoint (any member's), or since its start without one; null otherwise."
    )

    class Meta:
        model = Attempt
        fields = [
            "number",
            "state",
            "reason",
            "end_class",
            "created_at",
            "started_at",
            "ended_at",
            "work_lost_seconds",
            "members",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_work_lost_seconds(self, attempt) -> float | None:
        checkpoints = [member.checkpointed_at for member in attempt.members.all()]
        return work_lost(attempt.state, attempt.started_at, checkpoints, attempt.ended_at)


class WaitingSerializer(serializers.Serializer):
    """Q8: why it waits, as the allocator's last pass decided."""

    reason = serializers.ChoiceField(choices=WAIT_REASONS)
    message = serializers.CharField()
    numbers = serializers.DictField()
    position_in_project = serializers.IntegerField()
    position_in_fleet = serializers.IntegerField()
    since = serializers.DateTimeField()


class WaitChangeSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    reason = serializers.ChoiceField(choices=WAIT_REASONS)


class ReplicaWaitChangeSerializer(WaitChangeSerializer):
    rank = serializers.IntegerField()


def waiting_while(record, waits: bool) -> dict | None:
    """Q8: its reason to wait while it waits; null once it runs (or before the allocator's
    first pass over it)."""
    return record.waiting if waits else None


class PreemptionVictimSerializer(serializers.Serializer):
    job = serializers.CharField(
        help_text="trainingjob-3, lifecyclejob-5 …; to a reader outside its project: "
        "another project's work (R23)."
    )
    deadline = serializers.DateTimeField(help_text="When its members get SIGKILL at the latest.")


class PreemptionSerializer(serializers.Serializer):
    by = serializers.CharField(
        help_text="The preemptor: trainingjob-7, replica-3-0 …; to a reader outside its "
        "project: another project's work (R23)."
    )
    why = serializers.CharField()
    at = serializers.DateTimeField()
    deadline = serializers.DateTimeField(help_text="When its members get SIGKILL at the latest.")


class RetrySerializer(serializers.Serializer):
    on_exit_codes = serializers.ListField(child=serializers.IntegerField())
    max_attempts = serializers.IntegerField()


class ExcludedNodeSerializer(serializers.Serializer):
    node = serializers.CharField()
    reason = serializers.CharField()
    attempt = serializers.IntegerField()
    at = serializers.DateTimeField()


class ExcludedCardSerializer(ExcludedNodeSerializer):
    index = serializers.IntegerField()
    uuid = serializers.CharField()


class ExcludedSerializer(serializers.Serializer):
    nodes = ExcludedNodeSerializer(many=True)
    cards = ExcludedCardSerializer(many=True)


class InfraRetriesSerializer(serializers.Serializer):
    used = serializers.IntegerField()
    budget = serializers.IntegerField()


class JobSerializer(WorkloadSerializer):
    volumes = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True)
    datasets = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True)
    delivery = serializers.SerializerMethodField()
    state = serializers.ChoiceField(choices=JobState.choices, read_only=True)
    attempts = AttemptSerializer(many=True, read_only=True)
    env = serializers.SerializerMethodField(help_text="The names; values are not shown again.")
    waiting = serializers.SerializerMethodField(help_text="Q8: why it waits; null once placed.")
    waiting_history = WaitChangeSerializer(many=True, read_only=True)
    preemption = PreemptionSerializer(
        allow_null=True,
        read_only=True,
        help_text="Q6: its last preemption — by whom, why, when, and the deadline its members "
        "were given before SIGKILL; null if it was never preempted.",
    )
    retry = serializers.SerializerMethodField(
        help_text="H3: the exit codes that retry it, and the attempts its own (user) ends may "
        "spend."
    )
    excluded = serializers.SerializerMethodField(
        help_text="H2: the nodes, and the cards, its next attempts are never placed on: each "
        "where an earlier attempt ended by the machine's fault. An administrator may clear it."
    )
    infra_retries = serializers.SerializerMethodField(
        help_text="H2: its attempts ended by the machine's fault, and how many may be (its "
        "Fleet's infra_retries, else TUNEPLANE_INFRA_RETRIES); they never spend max_attempts."
    )

    class Meta(WorkloadSerializer.Meta):
        model = TrainingJob
        fields = WorkloadSerializer.Meta.fields + [
            "volumes",
            "datasets",
            "delivery",
            "command",
            "script",
            "image",
            "env",
            "cpus",
            "memory_bytes",
            "max_attempts",
            "retry",
            "infra_retries",
            "excluded",
            "priority",
            "preemptible",
            "preemption_grace_seconds",
            "gang_deadline_seconds",
            "state",
            "reason",
            "preemption",
            "cancel_requested_at",
            "ended_at",
            "waiting",
            "waiting_history",
            "attempts",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_env(self, job):
        return sorted(job.env)

    @extend_schema_field(WaitingSerializer(allow_null=True))
    def get_waiting(self, job) -> dict | None:
        return waiting_while(job, job.state == JobState.QUEUED)

    @extend_schema_field(RetrySerializer)
    def get_retry(self, job) -> dict:
        return {"on_exit_codes": list(job.retry_on_exit_codes), "max_attempts": job.max_attempts}

    @extend_schema_field(ExcludedSerializer)
    def get_excluded(self, job) -> dict:
        excluded = job.excluded or {}
        return {"nodes": excluded.get("nodes") or [], "cards": excluded.get("cards") or []}

    @extend_schema_field(InfraRetriesSerializer)
    def get_infra_retries(self, job) -> dict:
        used = sum(a.end_class == EndClass.INFRASTRUCTURE for a in job.attempts.all())
        return {"used": used, "budget": infra_retries_of(job.fleet)}

    @extend_schema_field(serializers.ListField(child=serializers.DictField()))
    def get_delivery(self, job):
        return delivery_of(job.fleet, job.volumes.all(), job.datasets.all())


class TrainingJobSerializer(JobSerializer):
    class Meta(JobSerializer.Meta):
        fields = JobSerializer.Meta.fields + [
            "backend_job_id",
            "backend_state",
            "backend_error",
        ]
        read_only_fields = fields


class LifecycleJobSerializer(JobSerializer):
    class Meta(JobSerializer.Meta):
        model = LifecycleJob
        fields = TrainingJobSerializer.Meta.fields + ["kind"]
        read_only_fields = fields


class ReplicaSerializer(serializers.ModelSerializer):
    """A revision's replica (S1): where it runs, whether it is Ready and, if not, why."""

    node = serializers.CharField(source="node_id", read_only=True)
    address = serializers.SerializerMethodField()
    state = serializers.ChoiceField(choices=RunState.choices, read_only=True)
    cleanup = serializers.ChoiceField(choices=Cleanup.choices, read_only=True)
    cards = serializers.ListField(child=serializers.DictField(), read_only=True)
    ready = serializers.SerializerMethodField()
    not_ready_because = serializers.SerializerMethodField()

    class Meta:
        model = Member
        fields = [
            "rank",
            "node",
            "address",
            "cards",
            "state",
            "reason",
            "ready",
            "not_ready_because",
            "restarts",
            "exit_code",
            "confinement",
            "cleanup",
            "started_at",
            "ended_at",
        ]
        read_only_fields = fields

    def get_address(self, member) -> str:
        return f"{host(member.node.address)}:{member.port}"

    def get_ready(self, member) -> bool:
        return replica_ready(member)

    def get_not_ready_because(self, member) -> str:
        return replica_not_ready(member)


class RevisionSerializer(ShownToReader, serializers.ModelSerializer):
    """A revision and whether it is Ready: on a node Fleet every replica is (S1); a recorded
    revision while its node answers for serve (L2)."""

    # Read from placement.selectors.revisions_with_ready, as the admin reads it.
    node = serializers.CharField(source="node_id", allow_null=True, read_only=True)
    ready = serializers.BooleanField(read_only=True)
    state = serializers.ChoiceField(choices=RevisionState.choices, read_only=True)
    env = serializers.SerializerMethodField(help_text="The names only: values are not shown.")
    members = ReplicaSerializer(many=True, read_only=True)
    waiting = serializers.SerializerMethodField(
        help_text="Q8: by replica rank, why each replica without a process waits."
    )
    waiting_history = ReplicaWaitChangeSerializer(
        many=True, read_only=True, help_text="Q8: each change of a replica's reason to wait."
    )

    class Meta:
        model = Revision
        fields = [
            "number",
            "state",
            "reason",
            "node",
            "ready",
            "command",
            "script",
            "image",
            "env",
            "port",
            "readiness_path",
            "replicas",
            "cpus",
            "memory_bytes",
            "created_at",
            "ended_at",
            "members",
            "waiting",
            "waiting_history",
        ]
        read_only_fields = fields

    def get_env(self, revision) -> list[str]:
        return sorted(revision.env)

    @extend_schema_field(serializers.DictField(child=WaitingSerializer()))
    def get_waiting(self, revision) -> dict:
        if revision.state != RevisionState.LIVE:
            return {}
        running = {str(m.rank) for m in revision.members.all() if m.cleanup == Cleanup.PENDING}
        return {rank: wait for rank, wait in revision.waiting.items() if rank not in running}


class DeploymentSerializer(WorkloadSerializer):
    # Status and readiness come computed for the whole list by
    # placement.selectors.workloads_shown_to, the selector the admin uses too.
    status = serializers.ChoiceField(
        choices=DeploymentStatus.choices,
        read_only=True,
        help_text="ready while every replica of the current revision is Ready (S1; a "
        "recorded revision: while its node answers for serve, L2); else degraded.",
    )
    revisions = RevisionSerializer(many=True, read_only=True)
    addresses = serializers.SerializerMethodField(
        help_text="host:port of each Ready replica of the live revisions: a client picks "
        "among them (the console is not a load balancer)."
    )

    class Meta(WorkloadSerializer.Meta):
        model = Deployment
        fields = WorkloadSerializer.Meta.fields + [
            "state",
            "status",
            "reason",
            "addresses",
            "revisions",
        ]
        read_only_fields = fields

    def get_addresses(self, deployment) -> list[str]:
        return [
            f"{host(member.node.address)}:{member.port}"
            for revision in deployment.revisions.all()
            if revision.state == RevisionState.LIVE
            for member in revision.members.all()
            if replica_ready(member)
        ]


class PlaygroundSessionSerializer(WorkloadSerializer):
    """On a node Fleet: its served process (S4), Ready as a replica is (S1), its address
    once Ready, and when its lifetime ends."""

    state = serializers.ChoiceField(choices=DeploymentState.choices, read_only=True)
    members = ReplicaSerializer(many=True, read_only=True)
    address = serializers.SerializerMethodField(help_text="host:port once Ready, else null.")
    waiting = serializers.SerializerMethodField(help_text="Q8: why it waits for its process.")
    waiting_history = WaitChangeSerializer(many=True, read_only=True)

    class Meta(WorkloadSerializer.Meta):
        model = PlaygroundSession
        fields = WorkloadSerializer.Meta.fields + [
            "state",
            "reason",
            "waiting",
            "waiting_history",
            "ends_at",
            "image",
            "port",
            "readiness_path",
            "address",
            "members",
        ]
        read_only_fields = fields

    @extend_schema_field(WaitingSerializer(allow_null=True))
    def get_waiting(self, session) -> dict | None:
        # As the pass reads it (waiting.SESSION_WAITS): live and never placed. Once it has a
        # process it waits no more, also after that process has ended (Q8).
        placed = bool(session.members.all())
        return waiting_while(session, session.state == DeploymentState.LIVE and not placed)

    def get_address(self, session) -> str | None:
        ready = [m for m in session.members.all() if replica_ready(m)]
        return f"{host(ready[0].node.address)}:{ready[0].port}" if ready else None


class EpisodeSerializer(ShownToReader, serializers.ModelSerializer):
    """An episode (S5): its state, exit code, duration and where it ran."""

    environment = serializers.IntegerField(source="environment_id", read_only=True)
    state = serializers.ChoiceField(choices=EpisodeState.choices, read_only=True)
    env = serializers.SerializerMethodField(help_text="The names only: values are not shown.")
    node = serializers.SerializerMethodField()
    duration_seconds = serializers.SerializerMethodField()
    waiting = serializers.SerializerMethodField(help_text="Q8: why it waits; null once placed.")
    waiting_history = WaitChangeSerializer(many=True, read_only=True)

    class Meta:
        model = Episode
        fields = [
            "environment",
            "number",
            "state",
            "reason",
            "waiting",
            "waiting_history",
            "exit_code",
            "command",
            "script",
            "image",
            "env",
            "cards",
            "timeout_seconds",
            "node",
            "created_at",
            "started_at",
            "ended_at",
            "duration_seconds",
        ]
        read_only_fields = fields

    def get_env(self, episode) -> list[str]:
        return sorted(episode.env)

    @extend_schema_field(WaitingSerializer(allow_null=True))
    def get_waiting(self, episode) -> dict | None:
        return waiting_while(episode, episode.state == EpisodeState.QUEUED)

    def get_node(self, episode) -> str | None:
        members = list(episode.members.all())
        return members[-1].node_id if members else None

    def get_duration_seconds(self, episode) -> float | None:
        if episode.started_at is None:
            return None
        return ((episode.ended_at or timezone.now()) - episode.started_at).total_seconds()


class EnvironmentSerializer(WorkloadSerializer):
    class Meta(WorkloadSerializer.Meta):
        model = Environment
        fields = WorkloadSerializer.Meta.fields + ["manifest"]
        read_only_fields = fields


class StorageSerializer(serializers.ModelSerializer):
    project = serializers.CharField(source="project.slug")

    class Meta:
        model = Volume
        fields = ["id", "project", "name", "uri", "created_at"]
        read_only_fields = fields


class DatasetSerializer(StorageSerializer):
    class Meta(StorageSerializer.Meta):
        model = Dataset


class OutputSerializer(serializers.Serializer):
    """A member's output as every logs endpoint answers it."""

    node = serializers.CharField()
    tail_bytes = serializers.IntegerField()
    offset = serializers.IntegerField(
        allow_null=True,
        help_text="Where `output` starts in the member's output, in bytes: the `offset` asked "
        "for, the oldest byte kept when the log was cut past it (`truncated`), or the end when "
        "asked past it. null from an agent older than offsets.",
    )
    next_offset = serializers.IntegerField(
        allow_null=True,
        help_text="Just past `output`: ask again with `offset` set to it to follow the log.",
    )
    truncated = serializers.BooleanField(
        help_text="What was asked reaches before the oldest byte the node keeps: older output "
        "was removed at the member's log limit."
    )
    output = serializers.CharField(help_text="UTF-8; undecodable bytes replaced.")


class LogsSerializer(OutputSerializer):
    attempt = serializers.IntegerField()
    rank = serializers.IntegerField()


class QuotaSerializer(serializers.Serializer):
    """A quota as the Fleet's quotas answer it (Q1), with what it holds, borrows and has
    queued, in cards."""

    project = serializers.CharField()
    series = serializers.CharField(help_text='"" any card.')
    guaranteed = serializers.IntegerField()
    limit = serializers.IntegerField(allow_null=True, help_text="null: unlimited.")
    weight = serializers.IntegerField()
    in_use = serializers.IntegerField()
    borrowed = serializers.IntegerField(help_text="Q3: max(0, in_use - guaranteed), now.")
    queued = serializers.IntegerField(help_text="Cards its queued jobs ask.")
    fair_share = serializers.FloatField(
        help_text="Q3: cards held now plus its recent average, per weight; lower goes first."
    )


class QuotasSerializer(serializers.Serializer):
    quotas = QuotaSerializer(many=True)


class QueuePositionSerializer(serializers.Serializer):
    position_in_project = serializers.IntegerField()
    position_in_fleet = serializers.IntegerField()


class AllocationPreviewSerializer(serializers.Serializer):
    """Q7: what the allocator's next pass would do with it (a dry run's)."""

    starts = serializers.BooleanField()
    nodes = serializers.ListField(child=serializers.CharField())
    waiting = WaitingSerializer(allow_null=True)
    preempts = PreemptionVictimSerializer(many=True)


_DRY_RUNS: dict = {}


def dry_run_of(answer):
    """A dry run's answer (Q7): ``answer``'s record as admission would make it, its ``id``
    null (nothing was made), and what the dry run adds: ``queue`` and ``allocation``."""
    if answer not in _DRY_RUNS:

        class Meta(answer.Meta):
            fields = [*answer.Meta.fields, "dry_run", "queue", "allocation"]
            read_only_fields = fields
            ref_name = None

        _DRY_RUNS[answer] = type(
            f"DryRun{answer.__name__.removesuffix('Serializer')}Serializer",
            (answer,),
            {
                "__module__": __name__,
                "Meta": Meta,
                "id": serializers.IntegerField(allow_null=True, help_text="null: nothing made."),
                "dry_run": serializers.BooleanField(),
                "queue": QueuePositionSerializer(
                    allow_null=True, help_text="Where a job would queue; null for the rest."
                ),
                "allocation": AllocationPreviewSerializer(
                    allow_null=True,
                    help_text="A job's or a deployment's on a node Fleet; null for the rest.",
                ),
            },
        )
    return _DRY_RUNS[answer]
