from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from tuneplane.api.fields import StrictCharField, StrictChoiceField, StrictSerializer
from tuneplane.permissions import is_admin

from ..choices import Cleanup, DeploymentState, DeploymentStatus, JobState, LifecycleKind, RunState
from ..models import (
    Attempt,
    Dataset,
    Deployment,
    Environment,
    LifecycleJob,
    Member,
    PlaygroundSession,
    Revision,
    TrainingJob,
    Volume,
)
from ..selectors import delivery_of

MAX_CARDS = 1024
MAX_NODES = 256


def _name():
    return StrictCharField(max_length=200)


def _names():
    return serializers.ListField(
        child=StrictCharField(max_length=63), required=False, default=list, max_length=64
    )


class CardsRequest(StrictSerializer):
    project = StrictCharField(max_length=50)
    name = _name()
    series = StrictCharField(max_length=63, required=False, allow_blank=True, default="")
    cards = serializers.IntegerField(min_value=1, max_value=MAX_CARDS, required=False, default=1)


class JobRequest(CardsRequest):
    """The run fields are checked by placement.runspec (the one place that knows them), so
    the API, the admin and a script refuse the same input with the same words."""

    nodes = serializers.IntegerField(min_value=1, max_value=MAX_NODES, required=False, default=1)
    volumes = _names()
    datasets = _names()
    command = serializers.ListField(
        child=StrictCharField(max_length=4096, allow_blank=True),
        max_length=64,
        required=False,
        default=list,
        help_text="On a node Fleet: the argv to run, or give `script`.",
    )
    script = StrictCharField(
        max_length=100_000,
        required=False,
        allow_blank=True,
        default="",
        help_text="Run by /bin/bash on a node Fleet; what a cluster Fleet's manager runs "
        "(a batch script for Slurm, an entrypoint for a RayJob).",
    )
    env = serializers.DictField(
        child=StrictCharField(max_length=4096, allow_blank=True),
        required=False,
        default=dict,
        help_text="Names to string values, for every member (not shown again).",
    )
    cpus = serializers.FloatField(
        min_value=0.001,
        max_value=1024,
        required=False,
        default=None,
        allow_null=True,
        help_text="CPUs each member is confined to (R5).",
    )
    memory_bytes = serializers.IntegerField(
        min_value=1 << 20,
        max_value=1 << 50,
        required=False,
        default=None,
        allow_null=True,
        help_text="Memory each member is confined to (R5); over it the member ends oom.",
    )
    max_attempts = serializers.IntegerField(
        min_value=1,
        max_value=10,
        required=False,
        default=3,
        help_text="Attempts in all, retries included (R9).",
    )
    gang_deadline_seconds = serializers.IntegerField(
        min_value=1,
        max_value=86_400,
        required=False,
        default=None,
        allow_null=True,
        help_text="A gang's members must all run within this of allocation (R3); "
        "TUNEPLANE_GANG_DEADLINE when not given.",
    )

    class Meta:
        ref_name = "JobRequest"


class TrainingJobRequest(JobRequest):
    class Meta:
        ref_name = "TrainingJobRequest"


class LifecycleJobRequest(JobRequest):
    kind = StrictChoiceField(choices=LifecycleKind.values)

    class Meta:
        ref_name = "LifecycleJobRequest"


class DeploymentRequest(CardsRequest):
    fleet = StrictCharField(max_length=63, required=False, allow_null=True, default=None)

    class Meta:
        ref_name = "DeploymentRequest"


class DeploymentUpdateRequest(StrictSerializer):
    state = StrictChoiceField(choices=DeploymentState.values, required=False)
    fleet = StrictCharField(max_length=63, required=False)

    class Meta:
        ref_name = "DeploymentUpdateRequest"


class PlaygroundRequest(CardsRequest):
    class Meta:
        ref_name = "PlaygroundRequest"


class EnvironmentRequest(StrictSerializer):
    project = StrictCharField(max_length=50)
    name = _name()
    manifest = serializers.JSONField()

    class Meta:
        ref_name = "EnvironmentRequest"


class StorageRequest(StrictSerializer):
    project = StrictCharField(max_length=50)
    name = serializers.SlugField(max_length=63)
    uri = StrictCharField(max_length=500, required=False, allow_blank=True, default="")

    class Meta:
        ref_name = "StorageRequest"


class WorkloadSerializer(serializers.ModelSerializer):
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
        ]
        read_only_fields = fields


class AttemptSerializer(serializers.ModelSerializer):
    state = serializers.ChoiceField(choices=RunState.choices, read_only=True)
    members = MemberSerializer(many=True, read_only=True)

    class Meta:
        model = Attempt
        fields = ["number", "state", "reason", "created_at", "started_at", "ended_at", "members"]
        read_only_fields = fields


class JobSerializer(WorkloadSerializer):
    volumes = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True)
    datasets = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True)
    delivery = serializers.SerializerMethodField()
    state = serializers.ChoiceField(choices=JobState.choices, read_only=True)
    attempts = AttemptSerializer(many=True, read_only=True)
    env = serializers.SerializerMethodField(help_text="The names; values are not shown again.")

    class Meta(WorkloadSerializer.Meta):
        model = TrainingJob
        fields = WorkloadSerializer.Meta.fields + [
            "volumes",
            "datasets",
            "delivery",
            "command",
            "script",
            "env",
            "cpus",
            "memory_bytes",
            "max_attempts",
            "gang_deadline_seconds",
            "state",
            "reason",
            "cancel_requested_at",
            "ended_at",
            "attempts",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_env(self, job):
        return sorted(job.env)

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


class RevisionSerializer(serializers.ModelSerializer):
    """A revision, and whether it is Ready: its node answers for serve (L2)."""

    # Read from placement.selectors.revisions_with_ready, as the admin reads it.
    node = serializers.CharField(source="node_id", allow_null=True, read_only=True)
    ready = serializers.BooleanField(read_only=True)

    class Meta:
        model = Revision
        fields = ["number", "node", "ready"]
        read_only_fields = fields


class DeploymentSerializer(WorkloadSerializer):
    # Status and readiness come computed for the whole list by
    # placement.selectors.workloads_shown_to, the selector the admin uses too.
    status = serializers.ChoiceField(
        choices=DeploymentStatus.choices,
        read_only=True,
        help_text="L2: degraded while any revision's node is quiet for serve.",
    )
    revisions = RevisionSerializer(many=True, read_only=True)

    class Meta(WorkloadSerializer.Meta):
        model = Deployment
        fields = WorkloadSerializer.Meta.fields + ["state", "status", "revisions"]
        read_only_fields = fields


class PlaygroundSessionSerializer(WorkloadSerializer):
    class Meta(WorkloadSerializer.Meta):
        model = PlaygroundSession


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


class LogsQuery(StrictSerializer):
    attempt = serializers.IntegerField(
        min_value=1, required=False, default=None, help_text="The latest when not given."
    )
    rank = serializers.IntegerField(min_value=0, required=False, default=0)
    tail_bytes = serializers.IntegerField(
        min_value=1, max_value=1 << 20, required=False, default=65536
    )

    class Meta:
        ref_name = "LogsQuery"


class LogsSerializer(serializers.Serializer):
    attempt = serializers.IntegerField()
    rank = serializers.IntegerField()
    node = serializers.CharField()
    tail_bytes = serializers.IntegerField()
    output = serializers.CharField(help_text="UTF-8; undecodable bytes replaced.")
