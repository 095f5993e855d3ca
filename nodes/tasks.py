"""Celery tasks: thin; each calls one service."""

from celery import shared_task

from .services.checks import health_checks_run
from .services.clusters import clusters_refresh
from .services.cordons import storage_cordon_sweep
from .services.drains import drains_overdue_mark
from .services.liveness import liveness_sweep


@shared_task(name="nodes.liveness_sweep", ignore_result=True)
def liveness_sweep_task() -> dict:
    return liveness_sweep()


@shared_task(name="nodes.storage_cordon_sweep", ignore_result=True)
def storage_cordon_sweep_task() -> dict:
    return storage_cordon_sweep()


@shared_task(name="nodes.clusters_refresh", ignore_result=True)
def clusters_refresh_task() -> dict:
    return clusters_refresh()


@shared_task(name="nodes.drains_overdue_mark", ignore_result=True)
def drains_overdue_mark_task() -> int:
    return drains_overdue_mark()


@shared_task(name="nodes.health_checks_run", ignore_result=True)
def health_checks_run_task() -> dict:
    return health_checks_run()
