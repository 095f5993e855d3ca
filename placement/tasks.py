"""Celery tasks: thin; each calls one service."""

from celery import shared_task

from .handover import (
    CANCEL_TASK,
    HANDOVER_TASK,
    cluster_job_cancel,
    cluster_job_handover,
    cluster_jobs_track,
)
from .services.allocator import allocate, allocate_all
from .services.episodes import episodes_time_out
from .services.passes import ALLOCATE_TASK
from .services.playground import sessions_expire
from .services.reconcile import members_reconcile
from .services.serving import rollouts_settle


@shared_task(name=HANDOVER_TASK, ignore_result=True)
def cluster_job_handover_task(job_id: int, kind: str = "trainingjob") -> None:
    cluster_job_handover(job_id, kind)


@shared_task(name="placement.cluster_jobs_track", ignore_result=True)
def cluster_jobs_track_task() -> dict:
    return cluster_jobs_track()


@shared_task(name=ALLOCATE_TASK, ignore_result=True)
def allocate_task(fleet_id: str) -> dict:
    return allocate(fleet_id=fleet_id)


@shared_task(name="placement.allocate_all", ignore_result=True)
def allocate_all_task() -> dict:
    return allocate_all()


@shared_task(name="placement.members_reconcile", ignore_result=True)
def members_reconcile_task() -> dict:
    return members_reconcile()


@shared_task(name=CANCEL_TASK, ignore_result=True)
def cluster_job_cancel_task(job_id: int, kind: str = "trainingjob") -> None:
    cluster_job_cancel(job_id, kind)


@shared_task(name="placement.rollouts_settle", ignore_result=True)
def rollouts_settle_task() -> dict:
    return rollouts_settle()


@shared_task(name="placement.sessions_expire", ignore_result=True)
def sessions_expire_task() -> dict:
    return sessions_expire()


@shared_task(name="placement.episodes_time_out", ignore_result=True)
def episodes_time_out_task() -> dict:
    return episodes_time_out()
