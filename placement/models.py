"""Workload records. Every admitted one keeps the Fleet it was admitted against (PROTECT)."""

from django.conf import settings
from django.db import models

from fleets.models import Fleet
from nodes.models import Node
from tuneplane.models import Project

from .choices import DeploymentState, LifecycleKind


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


class TrainingJob(Workload):
    volumes = models.ManyToManyField(Volume, blank=True, related_name="+")
    datasets = models.ManyToManyField(Dataset, blank=True, related_name="+")
    # What a cluster Fleet's manager runs (a batch script for Slurm, an entrypoint for Ray).
    script = models.TextField(blank=True)
    # The manager's own record of it, once handed over: its id, its state in its words, and
    # why handing it over failed, if it did. The allocator is the manager (P7).
    backend_job_id = models.CharField(max_length=200, blank=True)
    backend_state = models.CharField(max_length=32, blank=True)
    backend_error = models.TextField(blank=True)
    # Handing over: the key the manager knows the job by (a Slurm comment, part of a RayJob's
    # name), kept from the first attempt, and when the attempt under way began. A crash
    # between the manager's answer and our commit is resumed under the same key, so the job
    # is found, not submitted twice.
    handover_key = models.CharField(max_length=32, blank=True)
    handover_started_at = models.DateTimeField(null=True, blank=True)


class LifecycleJob(Workload):
    kind = models.CharField(max_length=16, choices=LifecycleKind.choices)
    volumes = models.ManyToManyField(Volume, blank=True, related_name="+")
    datasets = models.ManyToManyField(Dataset, blank=True, related_name="+")


class Deployment(Workload):
    state = models.CharField(
        max_length=16, choices=DeploymentState.choices, default=DeploymentState.LIVE
    )


class Revision(models.Model):
    """One version of a deployment, running on one node. Ready is not stored: it is whether
    that node answers for serve (L2), so it can never disagree with the liveness sweep;
    placement.selectors.revisions_with_ready computes it."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField()
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.PROTECT, related_name="revisions"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["deployment_id", "number"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "number"], name="one_revision_number")
        ]


class PlaygroundSession(Workload):
    pass


class Environment(Workload):
    manifest = models.JSONField(default=dict)
