from django.db import models


class FleetKind(models.TextChoices):
    NODE = "node"
    KUBERNETES = "kubernetes"
    SLURM = "slurm"


class FleetDelivery(models.TextChoices):
    SHARED_MOUNT = "shared-mount"
    OBJECT_PULL = "object-pull"


class FleetCapability(models.TextChoices):
    TRAIN = "train"
    EVAL = "eval"
    SERVE = "serve"
    ENV = "env"


class FleetVisibility(models.TextChoices):
    PUBLIC = "public"
    PROJECT = "project"


class FleetState(models.TextChoices):
    ACTIVE = "active"
    DRAINING = "draining"
    DISABLED = "disabled"


# F2: the delivery follows the backend unless the operator picks one.
DEFAULT_DELIVERY = {
    FleetKind.NODE: FleetDelivery.SHARED_MOUNT,
    FleetKind.SLURM: FleetDelivery.SHARED_MOUNT,
    FleetKind.KUBERNETES: FleetDelivery.OBJECT_PULL,
}
