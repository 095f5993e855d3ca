from django.db import models

from fleets.choices import FleetCapability

# Labels are the values: the admin shows the product page's own words.


class LifecycleKind(models.TextChoices):
    EVAL = "eval", "eval"
    EXPORT = "export", "export"
    MERGE = "merge", "merge"


# An eval needs a Fleet that promises eval; the other lifecycle jobs are training work.
LIFECYCLE_CAPABILITY = {
    LifecycleKind.EVAL: FleetCapability.EVAL,
    LifecycleKind.EXPORT: FleetCapability.TRAIN,
    LifecycleKind.MERGE: FleetCapability.TRAIN,
}


class DeploymentState(models.TextChoices):
    LIVE = "live", "live"
    STOPPED = "stopped", "stopped"


class RevisionState(models.TextChoices):
    """A revision on its way (S2): serving or rolling out; replaced by a newer one; rolled
    back (not Ready within its deadline); stopped with its deployment."""

    LIVE = "live", "live"
    RETIRED = "retired", "retired"
    ROLLED_BACK = "rolled_back", "rolled_back"
    STOPPED = "stopped", "stopped"


class DeploymentStatus(models.TextChoices):
    """What a deployment reports (L2): computed from its revisions' nodes, never stored."""

    READY = "ready", "ready"
    DEGRADED = "degraded", "degraded"
    STOPPED = "stopped", "stopped"


class Refusal(models.TextChoices):
    """Why admission refused (P6). The first three are the product's; the last two say what
    the submitter has to add."""

    CAPABILITY = "capability", "capability"
    STATE = "state", "state"
    INVENTORY_FIT = "inventory_fit", "inventory_fit"
    FLEET_NOT_NAMED = "fleet_not_named", "fleet_not_named"
    NO_NODE_ANSWERING = "no_node_answering", "no_node_answering"


class JobState(models.TextChoices):
    """A job on a node Fleet (DESIGN §7): queued until the allocator gives it cards."""

    QUEUED = "queued", "queued"
    STARTING = "starting", "starting"
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


JOB_ENDED = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class RunState(models.TextChoices):
    """An attempt's and a member's (DESIGN §7)."""

    STARTING = "starting", "starting"
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    UNKNOWN = "unknown", "unknown"
    LOST = "lost", "lost"
    CANCELLED = "cancelled", "cancelled"
    ABANDONED = "abandoned", "abandoned"


RUN_LIVE = (RunState.STARTING, RunState.RUNNING, RunState.UNKNOWN)


class Cleanup(models.TextChoices):
    PENDING = "pending", "pending"
    CLEANED = "cleaned", "cleaned"


class EpisodeState(models.TextChoices):
    """An episode (S5): queued until placed; ends by its exit or its own timeout."""

    QUEUED = "queued", "queued"
    STARTING = "starting", "starting"
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    TIMED_OUT = "timed_out", "timed_out"
    CANCELLED = "cancelled", "cancelled"


EPISODE_ENDED = (
    EpisodeState.SUCCEEDED,
    EpisodeState.FAILED,
    EpisodeState.TIMED_OUT,
    EpisodeState.CANCELLED,
)
