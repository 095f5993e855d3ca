"""Jobs (training and lifecycle) admitted to a cluster Fleet are handed to its manager, and
their state read back on the refresh schedule. Kept thin: admission and the record are the
product; Slurm or KubeRay is the allocator (P7).

Handing over is at most once: an attempt is marked before the manager is asked, a job with
a manager id is never handed over again, and an attempt that died is resumed under the same
key, found rather than submitted twice (cluster_job_handover).
"""

import logging
import uuid
from datetime import timedelta
from itertools import groupby
from operator import attrgetter

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from audit.services import Actor, audit_record
from fleets.choices import FleetKind
from nodes.backends import BackendError, JobSpec, OutcomeUnknown, backend_for, job_state_is_final
from nodes.backends.base import JobRead, ListsJobStates
from nodes.selectors import card_series

from . import faults
from .choices import JOB_ENDED, JOB_LIFECYCLE, EndClass, JobState, RunState
from .models import Attempt, LifecycleJob, TrainingJob

# A job's kind as tasks name it (its model's name), and back.
JOB_MODELS = {model._meta.model_name: model for model in (TrainingJob, LifecycleJob)}
Job = TrainingJob | LifecycleJob

logger = logging.getLogger("tuneplane.clusters")

SYSTEM = Actor.system("clusters")
HANDOVER_TASK = "placement.cluster_job_handover"  # placement.tasks.cluster_job_handover_task
CANCEL_TASK = "placement.cluster_job_cancel"
# An attempt to hand a job over that has not answered in this long died on the way (the
# backends' calls time out in seconds), and the next one resumes it.
HANDOVER_STALE = timedelta(seconds=60)


def handover_on_commit(job: Job) -> None:
    """At once through the broker; a message lost on the way (a broker down) costs one
    refresh interval, as cluster_jobs_track hands over what is still waiting. Sent by the
    task's name: tasks import services, never the reverse."""
    kind = job._meta.model_name
    transaction.on_commit(lambda: current_app.tasks[HANDOVER_TASK].delay(job.pk, kind), robust=True)


def cluster_job_handover(job_id: int, kind: str = "trainingjob") -> Job:
    """Hand one admitted job to its Fleet's manager and record the manager's id, or why not.

    In three steps, so no row lock is held while the manager is asked and a crash anywhere
    leaves a job handed over at most once: the attempt is marked (with the job's key) and
    committed; the manager is asked; its answer is recorded. An attempt found marked and
    older than HANDOVER_STALE died on the way, and is resumed under the same key: the
    manager finds the job it already has instead of taking a second one. So is an attempt
    whose call got no answer (OutcomeUnknown): the manager may have taken the job.
    """
    now = timezone.now()
    model = JOB_MODELS[kind]
    with transaction.atomic():
        job = model.objects.select_for_update(of=("self",)).select_related("fleet").get(pk=job_id)
        started = job.handover_started_at
        if job.backend_job_id or (started and now - started < HANDOVER_STALE):
            return job  # handed over, or being handed over now
        if job.cancel_requested_at is not None and not job.handover_key:
            return job  # cancelled before it was ever handed over
        resuming = bool(job.handover_key)  # an earlier attempt may have reached the manager
        job.handover_key = job.handover_key or f"tp-{uuid.uuid4().hex[:12]}"
        job.handover_started_at = now
        job.save(update_fields=["handover_key", "handover_started_at"])
    backend_job_id, error = "", ""
    try:
        backend = backend_for(job.fleet)
        spec = _spec(job)
        backend_job_id = backend.resume(spec) if resuming else backend.submit(spec)
    except OutcomeUnknown as exc:
        # It may have been taken: not a failure. Left marked, and stale at once, so the next
        # pass of cluster_jobs_track resumes it under the same key.
        logger.warning(
            "job %s on %s: no answer to the handover (%s); resumed next pass",
            job_id,
            job.fleet_id,
            exc,
        )
        model.objects.filter(pk=job_id, backend_job_id="").update(
            handover_started_at=now - HANDOVER_STALE
        )
        return job
    except BackendError as exc:
        error = str(exc)[:2000]
    except Exception as exc:  # a surprise is this job's failure, shown, not the loop's end
        logger.exception("job %s on %s: handover failed", job_id, job.fleet_id)
        error = f"the console failed to hand the job over: {type(exc).__name__}"
    with transaction.atomic():
        job = model.objects.select_for_update(of=("self",)).get(pk=job_id)
        if job.backend_job_id:
            if backend_job_id and backend_job_id != job.backend_job_id:
                _duplicate(job, backend_job_id)
            return job
        before = {"backend_job_id": "", "backend_error": job.backend_error}
        job.backend_job_id, job.backend_error = backend_job_id, error
        job.backend_state = "SUBMITTED" if backend_job_id else job.backend_state
        job.handover_started_at = None
        if not backend_job_id:
            JOB_LIFECYCLE.check(job.state, JobState.FAILED, target=job.pk)
            job.state, job.reason, job.ended_at = JobState.FAILED, "handover_failed", now
        job.save(
            update_fields=[
                "backend_job_id",
                "backend_state",
                "backend_error",
                "handover_started_at",
                "state",
                "reason",
                "ended_at",
            ]
        )
        audit_record(
            actor=SYSTEM,
            action=f"{kind}.handed_over" if backend_job_id else f"{kind}.handover_failed",
            target=job,
            before=before,
            after={
                "backend_job_id": backend_job_id,
                "backend_error": error,
                "key": job.handover_key,
                "resumed": resuming,
            },
        )
    return job


def _duplicate(job: Job, orphan: str) -> None:
    """An attempt judged dead (stalled past HANDOVER_STALE) answered after all, and the
    manager had taken the job from both: the first recorded stands; the other is named, for
    an operator to cancel."""
    logger.error(
        "job %s was handed over twice: %s is recorded, %s is not and runs unrecorded",
        job.pk,
        job.backend_job_id,
        orphan,
    )
    audit_record(
        actor=SYSTEM,
        action=f"{job._meta.model_name}.handed_over_twice",
        target=job,
        before={"backend_job_id": job.backend_job_id},
        after={"backend_job_id": job.backend_job_id, "unrecorded_job_id": orphan},
    )


def cluster_jobs_track() -> dict:
    """Hand over what is still waiting (a retry once its backoff is past, H8), then read
    back the state of every handed-over job not yet finished, a Fleet at a time; record each
    change."""
    changed = failed = 0
    now = timezone.now()
    for kind, model in JOB_MODELS.items():
        waiting = (
            model.objects.filter(
                backend_job_id="", backend_error="", cancel_requested_at__isnull=True
            )
            .filter(Q(not_before__isnull=True) | Q(not_before__lte=now))
            .exclude(fleet__kind=FleetKind.NODE)
            .values_list("id", flat=True)
        )
        for job_id in list(waiting):
            try:
                cluster_job_handover(job_id, kind)
            except Exception:  # the database, say: this job waits for the next pass
                failed += 1
                logger.exception("%s %s: handover not attempted", kind, job_id)
        open_jobs = (
            model.objects.exclude(backend_job_id="")
            .select_related("fleet")
            .order_by("fleet_id", "id")
        )
        for _, fleet_jobs in groupby(open_jobs.iterator(), key=attrgetter("fleet_id")):
            jobs = [job for job in fleet_jobs if not job_state_is_final(job.backend_state)]
            if jobs:
                counted = _fleet_jobs_track(model, kind, jobs)
                changed, failed = changed + counted[0], failed + counted[1]
    return {"changed": changed, "failed": failed}


def _fleet_jobs_track(model, kind: str, jobs: list[Job]) -> tuple[int, int]:
    """One Fleet's open jobs: cancels passed on first (R10), then every job's state read —
    from one list of them all where the Fleet's backend has one (a Kubernetes Fleet's paged
    list of its RayJobs), else, and for each job the list cannot answer for (_listed_read),
    one read of that job. Returns (changed, failed)."""
    changed = failed = 0
    fleet = jobs[0].fleet
    for job in jobs:
        if job.cancel_requested_at is not None and job.backend_cancel_sent_at is None:
            cluster_job_cancel(job.pk, kind)
    try:
        backend = backend_for(fleet)
    except Exception as exc:  # a config the backend refuses: every job waits
        logger.warning("%s on %s: %s", kind, fleet.pk, exc)
        return 0, len(jobs)
    listed = _listed_states(backend, fleet.pk)
    for job in jobs:
        try:
            read = _listed_read(listed.get(job.backend_job_id))
            read = read or _job_read(backend, job.backend_job_id)
        except Exception as exc:  # one job's trouble never stops the others
            failed += 1
            logger.warning("%s %s on %s: %s", kind, job.pk, job.fleet_id, exc)
            continue
        if read.state != job.backend_state:
            changed += _record_state(model, job.pk, read)
    return changed, failed


def _listed_states(backend, fleet_id: str) -> dict[str, str]:
    """The states of all the Fleet's jobs from one list, by id; none from a backend that
    cannot list them, or from a list that failed (each job is then read alone, as a backend
    without a list is: a manager that lets the console read a job but not list them still
    has its jobs followed)."""
    if not isinstance(backend, ListsJobStates):
        return {}
    try:
        return backend.job_states()
    except Exception as exc:
        logger.warning("jobs on %s not listed, read one by one: %s", fleet_id, exc)
        return {}


def _listed_read(listed: str | None) -> JobRead | None:
    """What a tracking pass takes from its Fleet's list of job states for one job: the state
    ``listed`` for it, or None where the job is read on its own — the list does not have it
    (deleted behind the console's back, which its own read tells from a job the list does
    not cover), or it lists a failure: H1's class of a manager's end (H8) is read from the
    manager's reason and message, which a list of states does not carry."""
    if listed is None or MANAGER_STATES.get(listed.upper()) == JobState.FAILED:
        return None
    return JobRead(listed)


def _job_read(backend, job_id: str) -> JobRead:
    """The manager's state of a job with its reason, message and restarts; a backend that
    reads the state only gives that."""
    if hasattr(backend, "job_read"):
        return backend.job_read(job_id)
    return JobRead(backend.job_state(job_id))


# A manager's job states (Slurm's, KubeRay's jobStatus and jobDeploymentStatus) in the
# console's words; one not named here leaves the job's state as it was.
MANAGER_STATES = {
    **dict.fromkeys(("PENDING", "SUBMITTED", "CONFIGURING", "INITIALIZING"), JobState.QUEUED),
    **dict.fromkeys(("RUNNING", "COMPLETING", "SUSPENDED"), JobState.RUNNING),
    **dict.fromkeys(("COMPLETED", "SUCCEEDED", "COMPLETE"), JobState.SUCCEEDED),
    **dict.fromkeys(("CANCELLED", "STOPPED"), JobState.CANCELLED),
    **dict.fromkeys(
        ("FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"),
        JobState.FAILED,
    ),
    # H8: the manager requeued it itself (Slurm's requeue after a node failure, RequeueExit):
    # queued again, the same attempt, nothing spent.
    **dict.fromkeys(faults.SLURM_REQUEUED, JobState.QUEUED),
    # Q6: the manager preempted it. Requeued (Slurm's PreemptMode=REQUEUE) it reads PENDING
    # next, and is queued again; cancelled by the preemption, it stays preempting.
    "PREEMPTED": JobState.PREEMPTING,
}


def followed(state: str, backend_state: str) -> str:
    """A job's state once its manager says ``backend_state`` (in the manager's words): what
    MANAGER_STATES maps it to, where the job's lifecycle allows that move; else unchanged
    (a job that has ended, a word not mapped, or a read out of order — a job seen queued
    and then already preempted keeps its state until the manager says more)."""
    mapped = MANAGER_STATES.get(backend_state.upper())
    if state in JOB_ENDED or mapped is None:
        return state
    return mapped if mapped == state or JOB_LIFECYCLE.allows(state, mapped) else state


def _record_state(model, job_id: int, read: JobRead | str) -> int:
    """The manager's state, and the job's own (DESIGN §7's words) read from it. A failure
    is an attempt of the job with its class (H1, H8); an infrastructure one is handed to the
    manager again after its backoff, on the job's infra_retries, never spending
    max_attempts (H2)."""
    read = read if isinstance(read, JobRead) else JobRead(read)
    state, now = read.state, timezone.now()
    with transaction.atomic():
        job = model.objects.select_for_update().get(pk=job_id)
        if job.backend_state == state:
            return 0
        before = {"backend_state": job.backend_state, "state": job.state}
        job.backend_state = state
        moved = followed(job.state, state)
        shown: dict = {"restarts": read.restarts} if read.restarts else {}
        if moved == JobState.FAILED:
            moved, shown = _after_manager_failure(job, read, now, before)
        if moved != job.state:
            JOB_LIFECYCLE.check(job.state, moved, target=job.pk)
            job.state = moved
            if moved in (JobState.FAILED, JobState.PREEMPTING):
                job.reason = state.lower()
            if moved == JobState.CANCELLED:
                job.reason = "cancelled"
            if moved in JOB_ENDED:
                job.ended_at = now
        if shown.get("reason"):
            job.reason = shown["reason"]
        audit_record(
            actor=SYSTEM,
            action=f"{job._meta.model_name}.backend_state",
            target=job,
            before=before,
            after={"backend_state": state, "state": job.state, **shown},
        )
        job.save(
            update_fields=[
                "backend_state",
                "state",
                "reason",
                "ended_at",
                "backend_job_id",
                "handover_key",
                "handover_started_at",
                "backend_cancel_sent_at",
                "not_before",
            ]
        )
    return 1


def _after_manager_failure(job: Job, read: JobRead, now, before: dict) -> tuple[str, dict]:
    """H1, H2, H8: the manager says the job failed. Its attempt is recorded with the class
    the manager's words give (placement.faults.manager_end_class). A ``user`` end fails the
    job, as before. An ``infrastructure`` end (a node failure under it) within the job's
    infra_retries queues it again, to be handed to the manager anew — a new submission under
    a new key — once its backoff has passed; past its budget the job fails."""
    end = faults.manager_end_class(read.state, reason=read.reason, message=read.message)
    end = end or EndClass.USER
    field = Attempt.job_field(job)
    counted = Attempt.objects.filter(**{field: job}).aggregate(
        number=Count("pk"),
        user=Count("pk", filter=Q(end_class=EndClass.USER)),
        infra=Count("pk", filter=Q(end_class=EndClass.INFRASTRUCTURE)),
    )
    attempt = Attempt.objects.create(
        **{field: job},
        fleet_id=job.fleet_id,
        number=counted["number"] + 1,
        state=RunState.FAILED,
        reason=read.state.lower()[:64],
        end_class=end,
        created_at=now,
        ended_at=now,
    )
    infra = counted["infra"] + (end == EndClass.INFRASTRUCTURE)
    after = faults.next_after(
        end=end,
        reason=read.state.lower(),
        exit_code=None,
        user_ends=counted["user"] + (end == EndClass.USER),
        max_attempts=job.max_attempts,
        infra_ends=infra,
        infra_retries=faults.infra_retries_of(job.fleet),
        backoff_first=settings.TUNEPLANE_INFRA_BACKOFF_FIRST,
        backoff_max=settings.TUNEPLANE_INFRA_BACKOFF_MAX,
    )
    shown = {
        "attempt": attempt.number,
        "end_class": end,
        **({"manager_reason": read.reason} if read.reason else {}),
        **({"restarts": read.restarts} if read.restarts else {}),
    }
    if job.cancel_requested_at is not None:
        return JobState.CANCELLED, shown  # asked to stop: nothing runs again (R10)
    if not after.retry:
        if end == EndClass.INFRASTRUCTURE:
            shown["reason"] = after.reason  # "node_fail; infra_retries spent"
        return JobState.FAILED, shown
    # Handed over anew: the failed job is the manager's record, named in the audit event.
    before["backend_job_id"] = job.backend_job_id
    job.backend_job_id, job.handover_key = "", ""
    job.handover_started_at = job.backend_cancel_sent_at = None
    job.not_before = now + after.backoff
    return JobState.QUEUED, {
        **shown,
        "reason": after.reason,
        "not_before": job.not_before.isoformat(),
        "infra_retries": {"used": infra, "budget": faults.infra_retries_of(job.fleet)},
    }


def cluster_job_cancel_on_commit(job: Job) -> None:
    kind = job._meta.model_name
    transaction.on_commit(lambda: current_app.tasks[CANCEL_TASK].delay(job.pk, kind), robust=True)


def cluster_job_cancel(job_id: int, kind: str = "trainingjob") -> Job:
    """R10 on a cluster Fleet: the manager is asked to stop the job, once; its end is read
    back as any state is (CANCELLED), and the job follows. A manager that cannot be reached
    now is asked again on the next tracking pass."""
    model = JOB_MODELS[kind]
    job = model.objects.select_related("fleet").get(pk=job_id)
    if (
        not job.backend_job_id
        or job.backend_cancel_sent_at
        or job_state_is_final(job.backend_state)
    ):
        return job
    try:
        backend_for(job.fleet).cancel(job.backend_job_id)
    except Exception as exc:  # the next pass asks again
        logger.warning("job %s on %s: cancel not taken: %s", job_id, job.fleet_id, exc)
        return job
    with transaction.atomic():
        job = model.objects.select_for_update(of=("self",)).get(pk=job_id)
        job.backend_cancel_sent_at = timezone.now()
        job.save(update_fields=["backend_cancel_sent_at"])
        audit_record(
            actor=SYSTEM,
            action=f"{kind}.cancel_sent",
            target=job,
            before={"backend_cancel_sent_at": None},
            after={"backend_job_id": job.backend_job_id},
        )
    return job


def _spec(job: Job) -> JobSpec:
    if not job.script:
        raise BackendError("the job has no script: a cluster Fleet's manager needs one to run")
    return JobSpec(
        name=job.name,
        script=job.script,
        series=_card_name(job),
        cards=job.cards,
        nodes=job.nodes,
        key=job.handover_key,
    )


def _card_name(job: Job) -> str:
    """The manager's name for the series pinned: a card name of its snapshot that the
    registry maps to it (J4)."""
    if not job.series:
        return ""
    snapshot = getattr(job.fleet, "cluster_snapshot", None)
    names = {
        card["name"]
        for machine in (snapshot.machines if snapshot else [])
        for card in machine["cards"]
    }
    mapped = sorted(name for name, slug in card_series(names).items() if slug == job.series)
    if not mapped:
        raise BackendError(f"no card of series {job.series} in the Fleet's last snapshot")
    return mapped[0]
