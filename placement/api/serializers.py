from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from tuneplane.api.fields import StrictCharField, StrictChoiceField, StrictSerializer
from tuneplane.permissions import is_admin

from ..choices import DeploymentState, DeploymentStatus, LifecycleKind
from ..models import (
    Dataset,
    Deployment,
    Environment,
    LifecycleJob,
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
    nodes = serializers.IntegerField(min_value=1, max_value=MAX_NODES, required=False, default=1)
    volumes = _names()
    datasets = _names()

    class Meta:
        ref_name = "JobRequest"


class TrainingJobRequest(JobRequest):
    script = StrictCharField(
        max_length=100_000,
        required=False,
        allow_blank=True,
        default="",
        help_text="What a cluster Fleet's manager runs: a batch script "
        "for Slurm, an entrypoint for a RayJob.",
    )

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


class JobSerializer(WorkloadSerializer):
    volumes = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True)
    datasets = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True)
    delivery = serializers.SerializerMethodField()

    class Meta(WorkloadSerializer.Meta):
        model = TrainingJob
        fields = WorkloadSerializer.Meta.fields + ["volumes", "datasets", "delivery"]
        read_only_fields = fields

    @extend_schema_field(serializers.ListField(child=serializers.DictField()))
    def get_delivery(self, job):
        return delivery_of(job.fleet, job.volumes.all(), job.datasets.all())


class TrainingJobSerializer(JobSerializer):
    class Meta(JobSerializer.Meta):
        fields = JobSerializer.Meta.fields + [
            "script",
            "backend_job_id",
            "backend_state",
            "backend_error",
        ]
        read_only_fields = fields


class LifecycleJobSerializer(JobSerializer):
    class Meta(JobSerializer.Meta):
        model = LifecycleJob
        fields = JobSerializer.Meta.fields + ["kind"]
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
