"""F7's placement half: what a Fleet's deletion waits for, registered with fleets from
placement/apps.py so that fleets never imports placement."""

from .choices import Cleanup, DeploymentState
from .models import Deployment, Environment, LifecycleJob, PlaygroundSession, TrainingJob


def live_deployments_blocking_deletion(fleet) -> list[str]:
    """Live deployments pinned to the Fleet: stopped first."""
    count = Deployment.objects.filter(fleet=fleet, state=DeploymentState.LIVE).count()
    return (
        [f"{count} live deployment{'s' if count != 1 else ''} pinned to it; stop them first"]
        if count
        else []
    )


def workload_records_blocking_deletion(fleet) -> list[str]:
    """Every admitted workload keeps the Fleet it was admitted against: its record would
    point at nothing."""
    counted = [
        (model._meta.verbose_name_plural, model.objects.filter(fleet=fleet).count())
        for model in (TrainingJob, LifecycleJob, PlaygroundSession, Environment)
    ]
    # A stopped deployment is let go of with the Fleet (serving.stopped_deployments_release)
    # once its node has cleaned up every replica it ran.
    cleaning = (
        Deployment.objects.filter(fleet=fleet, state=DeploymentState.STOPPED)
        .filter(revisions__members__cleanup=Cleanup.PENDING)
        .distinct()
        .count()
    )
    counted.append(("stopped deployments still cleaning up", cleaning))
    return [f"{count} {name} recorded against it" for name, count in counted if count]
