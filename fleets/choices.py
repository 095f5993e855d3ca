from django.db import models

# Labels are the values: the admin shows the product page's own words.


class FleetKind(models.TextChoices):
    NODE = "node", "node"
    KUBERNETES = "kubernetes", "kubernetes"
    SLURM = "slurm", "slurm"


class FleetDelivery(models.TextChoices):
    SHARED_MOUNT = "shared-mount", "shared-mount"
    OBJECT_PULL = "object-pull", "object-pull"


class FleetCapability(models.TextChoices):
    TRAIN = "train", "train"
    EVAL = "eval", "eval"
    SERVE = "serve", "serve"
    ENV = "env", "env"


class FleetVisibility(models.TextChoices):
    PUBLIC = "public", "public"
    PROJECT = "project", "project"


class FleetState(models.TextChoices):
    ACTIVE = "active", "active"
    DRAINING = "draining", "draining"
    DISABLED = "disabled", "disabled"


# F2: the delivery follows the backend unless the operator picks one.
DEFAULT_DELIVERY = {
    FleetKind.NODE: FleetDelivery.SHARED_MOUNT,
    FleetKind.SLURM: FleetDelivery.SHARED_MOUNT,
    FleetKind.KUBERNETES: FleetDelivery.OBJECT_PULL,
}
