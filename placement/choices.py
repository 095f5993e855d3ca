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
