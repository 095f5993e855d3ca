"""Submitting workloads: admission, then the record, in one transaction, audited (A1).

The Fleet row is locked while the record is written, so a Fleet deletion racing an
admission either sees the record (and refuses, F7) or wins before it (and the
admission answers not found) — never a record pointing at a deleted Fleet.
"""

from django.conf import settings
from django.db import transaction

from audit.services import Actor, audit_record
from fleets.choices import FleetCapability, FleetKind, FleetState
from fleets.selectors import fleet_not_found, fleets_open_to
from tuneplane.errors import NotFound, PlacementRefused, ValidationFailed
from tuneplane.models import Membership, Project
from tuneplane.permissions import is_admin

from ..admission import Admitted, Need, admit_automatically, admit_deployment, admit_named
from ..choices import (
    LIFECYCLE_CAPABILITY,
    LifecycleKind,
    Refusal,
)
from ..handover import handover_on_commit
from ..models import (
    Dataset,
    Deployment,
    Environment,
    LifecycleJob,
    PlaygroundSession,
    Revision,
    TrainingJob,
    Volume,
)
from ..runspec import (
    checked_run,
    checked_serve,
    checked_session,
    require_runnable,
    require_servable,
)
from .passes import allocate_on_commit
from .playground import session_ends_at


def project_for(user, slug: str) -> Project:
    """The project a member submits to; another project reads as one that does not exist."""
    project = Project.objects.filter(slug=slug).first() if isinstance(slug, str) else None
    if project is None or not (
        is_admin(user) or Membership.objects.filter(project=project, user=user).exists()
    ):
        raise NotFound(f"Project '{str(slug)[:80]}' not found.")
    return project


def _storage(project: Project, model, names, field: str) -> list:
    names = list(dict.fromkeys(names or []))
    found = {
        record.name: record for record in model.objects.filter(project=project, name__in=names)
    }
    missing = [name for name in names if name not in found]
    if missing:
        raise ValidationFailed(
            f"{field}: no {model._meta.verbose_name} '{missing[0]}' in project '{project.slug}'.",
            field=field,
        )
    return [found[name] for name in names]


def _record(
    model,
    *,
    actor: Actor,
    project: Project,
    admitted: Admitted,
    extra_after=None,
    check=None,
    **fields,
):
    """Write the admitted workload against its locked Fleet, and audit it."""
    fleet = (
        fleets_open_to(project).select_for_update(of=("self",)).filter(pk=admitted.fleet_id).first()
    )
    if fleet is None:  # gone, or made another project's, since the gates ran (F8)
        raise fleet_not_found(admitted.fleet_id)
    if fleet.state != FleetState.ACTIVE:  # changed since the gates ran
        raise PlacementRefused(
            f"Fleet '{fleet.id}' is {fleet.state}: it takes no new work (rule D1).",
            reason=Refusal.STATE,
        )
    if check is not None:
        check(fleet)
    record = model.objects.create(
        project=project,
        fleet=fleet,
        admission=admitted.as_record(),
        created_by=actor.user,
        **fields,
    )
    audit_record(
        actor=actor,
        action=f"{model._meta.model_name}.admitted",
        target=record,
        after={
            "project": project.slug,
            "fleet": fleet.id,
            "gates": admitted.gates,
            **{
                key: value
                for key, value in fields.items()
                if isinstance(value, (str, int, float, list)) and key not in ("script", "env")
            },
            **({"env": sorted(fields["env"])} if fields.get("env") else {}),
            **(extra_after or {}),
        },
    )
    return record


def _job(model, *, actor: Actor, project_slug, need: Need, volumes, datasets, run, **fields):
    run = checked_run(**run)
    project = project_for(actor.user, project_slug)
    if run["priority"] > project.max_priority:
        raise ValidationFailed(
            f"priority: project '{project.slug}' may ask at most {project.max_priority} "
            f"(its administrator sets the cap, Q3); this job asks {run['priority']}.",
            field="priority",
        )
    volumes = _storage(project, Volume, volumes, "volumes")
    datasets = _storage(project, Dataset, datasets, "datasets")
    admitted = admit_automatically(project, need)
    with transaction.atomic():
        job = _record(
            model,
            actor=actor,
            project=project,
            admitted=admitted,
            series=need.series,
            cards=need.cards,
            nodes=need.nodes,
            check=_runnable_on_node(run),
            **run,
            **fields,
        )
        job.volumes.set(volumes)
        job.datasets.set(datasets)
        if job.fleet.kind == FleetKind.NODE:
            allocate_on_commit(job.fleet_id)
        else:
            handover_on_commit(job)
    return job


def _runnable_on_node(run: dict):
    """The check a job's record makes once its Fleet is known and locked."""
    return lambda fleet: require_runnable(run) if fleet.kind == FleetKind.NODE else None


def training_job_submit(
    *,
    actor: Actor,
    project: str,
    name: str,
    series: str = "",
    cards: int = 1,
    nodes: int = 1,
    volumes=(),
    datasets=(),
    **run,
) -> TrainingJob:
    """P1: placed automatically among the visible Fleets that pass every gate. On a node
    Fleet the allocator then gives it cards and the agents run it — ``run`` is what
    (placement.runspec: command or script, env, cpus, memory_bytes, max_attempts,
    gang_deadline_seconds); on a cluster Fleet its script is handed to the manager
    (placement.handover)."""
    return _job(
        TrainingJob,
        actor=actor,
        project_slug=project,
        volumes=volumes,
        datasets=datasets,
        need=Need(FleetCapability.TRAIN, series, cards, nodes, container=bool(run.get("image"))),
        run=run,
        name=name,
    )


def lifecycle_job_submit(
    *,
    actor: Actor,
    project: str,
    name: str,
    kind: str,
    series: str = "",
    cards: int = 1,
    nodes: int = 1,
    volumes=(),
    datasets=(),
    **run,
) -> LifecycleJob:
    """The same placement on the same gates; eval needs eval, the others train."""
    if kind not in LifecycleKind.values:
        raise ValidationFailed(
            f"kind must be one of {', '.join(LifecycleKind.values)}.", field="kind"
        )
    return _job(
        LifecycleJob,
        actor=actor,
        project_slug=project,
        volumes=volumes,
        datasets=datasets,
        need=Need(
            LIFECYCLE_CAPABILITY[kind], series, cards, nodes, container=bool(run.get("image"))
        ),
        run=run,
        name=name,
        kind=kind,
    )


def deployment_submit(
    *,
    actor: Actor,
    project: str,
    name: str,
    fleet: str | None = None,
    series: str = "",
    cards: int = 1,
    **serve,
) -> Deployment:
    """P2: the named Fleet, or the only visible serving one. On a node Fleet its first
    revision serves ``serve`` (placement.runspec.checked_serve: a command or script, env,
    port, readiness path, replicas, cpus, memory) and the allocator places each replica
    with its cards (S1); elsewhere the revision is recorded on the node that fits best."""
    serve = checked_serve(**serve)
    project = project_for(actor.user, project)
    need = Need(FleetCapability.SERVE, series, cards, container=bool(serve["image"]))
    admitted = admit_deployment(project, fleet, need)
    with transaction.atomic():
        deployment = _record(
            Deployment,
            actor=actor,
            project=project,
            admitted=admitted,
            name=name,
            series=series,
            cards=cards,
            check=lambda fleet: require_servable(serve) if fleet.kind == FleetKind.NODE else None,
            extra_after={"replicas": serve["replicas"], "port": serve["port"]},
        )
        on_node = deployment.fleet.kind == FleetKind.NODE
        Revision.objects.create(
            deployment=deployment,
            number=1,
            node_id=admitted.nodes[0] if admitted.nodes and not on_node else None,
            **{**serve, "port": serve["port"] if on_node else None},  # recorded: L2 only
        )
        if on_node:
            allocate_on_commit(deployment.fleet_id)
    return deployment


def playground_session_submit(
    *, actor: Actor, project: str, name: str, series: str = "", cards: int = 1, **serve
) -> PlaygroundSession:
    """P4: among serving Fleets of kind node or kubernetes — never a slurm one. On a node
    Fleet it serves ``serve`` (placement.runspec.checked_session) for ``ttl_seconds``: the
    allocator places it like a replica, and at its end it is stopped and cleaned (S4)."""
    serve = checked_session(max_ttl=settings.TUNEPLANE_PLAYGROUND_MAX_TTL, **serve)
    ttl = serve.pop("ttl_seconds")
    project = project_for(actor.user, project)
    admitted = admit_automatically(
        project,
        Need(
            FleetCapability.SERVE,
            series,
            cards,
            kinds=(FleetKind.NODE, FleetKind.KUBERNETES),
            container=bool(serve["image"]),
        ),
    )
    with transaction.atomic():
        session = _record(
            PlaygroundSession,
            actor=actor,
            project=project,
            admitted=admitted,
            name=name,
            series=series,
            cards=cards,
            check=lambda fleet: require_servable(serve) if fleet.kind == FleetKind.NODE else None,
            extra_after={"port": serve["port"], "ttl_seconds": ttl},
            ends_at=session_ends_at(ttl),
            **serve,
        )
        if session.fleet.kind == FleetKind.NODE:
            allocate_on_commit(session.fleet_id)
        return session


def environment_submit(*, actor: Actor, project: str, name: str, manifest) -> Environment:
    """P5: the manifest names the Fleet, which must declare env."""
    if (
        not isinstance(manifest, dict)
        or not isinstance(manifest.get("fleet"), str)
        or not manifest["fleet"]
    ):
        raise ValidationFailed(
            "manifest.fleet must name the Fleet the environment runs on (rule P5).",
            field="manifest.fleet",
        )
    project = project_for(actor.user, project)
    admitted = admit_named(project, manifest["fleet"], Need(FleetCapability.ENV))
    with transaction.atomic():
        return _record(
            Environment,
            actor=actor,
            project=project,
            admitted=admitted,
            name=name,
            manifest=manifest,
        )
