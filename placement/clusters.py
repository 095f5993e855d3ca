"""Training jobs admitted to a cluster Fleet are handed to its manager, and their state read
back on the refresh schedule. Kept thin: admission and the record are the product; Slurm or
KubeRay is the allocator (P7).

Handing over is at most once: the job row is locked while the manager is asked, and a job
with a manager id is never handed over again.
"""

import logging

from django.db import transaction

from audit.services import Actor, audit_record
from fleets.choices import FleetKind
from nodes.backends import BackendError, JobSpec, backend_for, job_state_is_final
from nodes.selectors import card_series

from .models import TrainingJob

logger = logging.getLogger("tuneplane.clusters")

SYSTEM = Actor.system("clusters")


def handover_on_commit(job: TrainingJob) -> None:
    """At once through the broker; a message lost on the way (a broker down) costs one
    refresh interval, as cluster_jobs_track hands over what is still waiting."""
    from .tasks import cluster_job_handover_task

    transaction.on_commit(lambda: cluster_job_handover_task.delay(job.pk), robust=True)


def cluster_job_handover(job_id: int) -> TrainingJob:
    """Hand one admitted job to its Fleet's manager and record the manager's id, or why not."""
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update(of=("self",)).select_related("fleet") \
            .get(pk=job_id)
        if job.backend_job_id:
            return job
        before = {"backend_job_id": "", "backend_error": job.backend_error}
        try:
            job.backend_job_id = backend_for(job.fleet).submit(_spec(job))
            job.backend_state, job.backend_error = "SUBMITTED", ""
        except BackendError as exc:
            job.backend_error = str(exc)[:2000]
        job.save(update_fields=["backend_job_id", "backend_state", "backend_error"])
        audit_record(actor=SYSTEM, action="trainingjob.handed_over" if job.backend_job_id
                     else "trainingjob.handover_failed", target=job, before=before,
                     after={"backend_job_id": job.backend_job_id,
                            "backend_error": job.backend_error})
    return job


def cluster_jobs_track() -> dict:
    """Hand over what is still waiting, then read back the state of every handed-over job
    not yet finished; record each change."""
    changed = failed = 0
    waiting = (TrainingJob.objects.filter(backend_job_id="", backend_error="")
               .exclude(fleet__kind=FleetKind.NODE).values_list("id", flat=True))
    for job_id in list(waiting):
        cluster_job_handover(job_id)
    open_jobs = (TrainingJob.objects.exclude(backend_job_id="").select_related("fleet")
                 .order_by("id"))
    for job in open_jobs.iterator():
        if job_state_is_final(job.backend_state):
            continue
        try:
            state = backend_for(job.fleet).job_state(job.backend_job_id)
        except Exception as exc:  # one job's trouble never stops the others
            failed += 1
            logger.warning("job %s on %s: %s", job.pk, job.fleet_id, exc)
            continue
        if state != job.backend_state:
            changed += _record_state(job.pk, state)
    return {"changed": changed, "failed": failed}


def _record_state(job_id: int, state: str) -> int:
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job_id)
        if job.backend_state == state:
            return 0
        audit_record(actor=SYSTEM, action="trainingjob.backend_state", target=job,
                     before={"backend_state": job.backend_state},
                     after={"backend_state": state})
        job.backend_state = state
        job.save(update_fields=["backend_state"])
    return 1


def _spec(job: TrainingJob) -> JobSpec:
    if not job.script:
        raise BackendError("the job has no script: a cluster Fleet's manager needs one to run")
    return JobSpec(name=job.name, script=job.script, series=_card_name(job),
                   cards=job.cards, nodes=job.nodes)


def _card_name(job: TrainingJob) -> str:
    """The manager's name for the series pinned: a card name of its snapshot that the
    registry maps to it (J4)."""
    if not job.series:
        return ""
    snapshot = getattr(job.fleet, "cluster_snapshot", None)
    names = {card["name"] for machine in (snapshot.machines if snapshot else [])
             for card in machine["cards"]}
    mapped = sorted(name for name, slug in card_series(names).items() if slug == job.series)
    if not mapped:
        raise BackendError(f"no card of series {job.series} in the Fleet's last snapshot")
    return mapped[0]
