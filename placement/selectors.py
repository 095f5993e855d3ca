"""Shared reads of placement: who sees which workloads, and where an environment answers."""

from django.conf import settings
from django.db.models import (
    BooleanField,
    Case,
    Count,
    F,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce
from django.utils import timezone

from fleets.choices import FleetCapability, FleetDelivery, FleetState
from nodes.choices import SchedulingState
from nodes.models import Node
from tuneplane.errors import PlacementRefused
from tuneplane.models import Membership
from tuneplane.permissions import is_admin

from .admission import Need, admit_named
from .choices import (
    DeploymentState,
    DeploymentStatus,
    JobState,
    Refusal,
    RevisionState,
    RunState,
)
from .models import (
    Attempt,
    Dataset,
    Deployment,
    Environment,
    Job,
    LifecycleJob,
    Member,
    PlaygroundSession,
    Revision,
    TrainingJob,
    Volume,
    Workload,
)

DEFAULT_STORAGE_ROOT = "/srv/tuneplane"

# L2: a revision is Ready while its node answers for serve — it has one, the liveness sweep
# has not found it quiet for serve, and it is neither gone nor removed.
REVISION_READY = Case(
    When(node__isnull=True, then=Value(False)),
    When(node__quiet_serve=True, then=Value(False)),
    When(
        node__scheduling_state__in=(SchedulingState.GONE, SchedulingState.REMOVED),
        then=Value(False),
    ),
    default=Value(True),
)
# S1: a replica is Ready when its node answers for serve (L2), its process runs and the
# agent's readiness probe passes.
REPLICA_READY = Q(state=RunState.RUNNING, ready=True, node__quiet_serve=False) & ~Q(
    node__scheduling_state__in=(SchedulingState.GONE, SchedulingState.REMOVED)
)
NODE_DOWN = (SchedulingState.GONE, SchedulingState.REMOVED)


def replica_ready(member: Member) -> bool:
    """REPLICA_READY for a member in hand (its node loaded)."""
    return (
        member.state == RunState.RUNNING
        and member.ready
        and not member.node.quiet_serve
        and member.node.scheduling_state not in NODE_DOWN
    )


def replica_not_ready(member: Member) -> str:
    """Why a replica is not Ready, in an operator's words; "" when it is."""
    node = member.node
    if member.state != RunState.RUNNING:
        return f"{member.state}" + (f": {member.reason}" if member.reason else "")
    if node.scheduling_state in NODE_DOWN:
        return f"node {node.scheduling_state}"
    if node.quiet_serve:
        return "node quiet for serve (L2)"
    if member.reason == "restarting":
        return f"process restarting ({member.restarts} restarts so far): {member.detail}"
    if not member.ready:
        return f"probe failing: {member.detail}" if member.detail else "waiting for its probe"
    return ""


def workloads_visible_to(user, model) -> QuerySet:
    """A project's workloads (and volumes, datasets) are its members' to see; administrators
    see all."""
    records = model.objects.select_related(
        "project", *(["fleet"] if issubclass(model, Workload) else [])
    )
    if is_admin(user):
        return records
    return records.filter(project__in=Membership.objects.filter(user=user).values("project_id"))


def projects_read_by(user):
    """R23: whether ``user`` reads a project's work by name — administrators every project's,
    a member their projects' (as workloads_visible_to), anyone else none's: a predicate on a
    project's id (None: not recorded, an administrator's alone). One query, at most."""
    if is_admin(user):
        return lambda project: True
    if user is None or not user.is_authenticated:
        return lambda project: False
    own = frozenset(Membership.objects.filter(user=user).values_list("project_id", flat=True))
    return lambda project: project is not None and project in own


def workloads_shown_to(user, model) -> QuerySet:
    """The records of ``model`` a user sees, each with all that the API shows of it — its
    submitter, its volumes and datasets with their projects, a deployment's status and
    revisions — loaded for a whole list in a fixed number of queries."""
    records = workloads_visible_to(user, model)
    if issubclass(model, Workload):
        records = records.select_related("created_by")
    if model in (TrainingJob, LifecycleJob):
        records = records.prefetch_related(
            Prefetch("volumes", queryset=Volume.objects.select_related("project")),
            Prefetch("datasets", queryset=Dataset.objects.select_related("project")),
            Prefetch(
                "attempts",
                queryset=Attempt.objects.order_by("number").prefetch_related(
                    Prefetch("members", queryset=Member.objects.order_by("rank"))
                ),
            ),
        )
    if model is PlaygroundSession:
        records = records.prefetch_related(
            Prefetch("members", queryset=Member.objects.select_related("node").order_by("pk"))
        )
    if model is Deployment:
        records = deployments_with_status(records).prefetch_related(
            Prefetch("revisions", queryset=revisions_with_ready()),
            Prefetch(
                "revisions__members",
                queryset=Member.objects.select_related("node").order_by("rank"),
            ),
        )
    return records


def workloads_listed(user, model, *, states=(), project: str = "") -> QuerySet:
    """A list as the API shows it (workloads_shown_to), narrowed to records in any of
    ``states`` and to the project whose slug is ``project``. A project the user may not see
    lists nothing, exactly as one that does not exist."""
    records = workloads_shown_to(user, model)
    if states:
        records = records.filter(state__in=states)
    if project:
        records = records.filter(project__slug=project)
    return records


def revisions_with_ready(revisions: QuerySet[Revision] | None = None) -> QuerySet[Revision]:
    """Each revision with ``ready``, computed in the query: never stored, so it cannot
    disagree with the liveness sweep, and never a query per revision. A revision a node
    Fleet serves (it has a port) is Ready when all its replicas are (S1); a recorded one,
    while its node answers for serve (L2)."""
    revisions = Revision.objects.all() if revisions is None else revisions
    return _with_ready(revisions.select_related("node"))


def _with_ready(revisions: QuerySet[Revision]) -> QuerySet[Revision]:
    ready_replicas = (
        Member.objects.filter(REPLICA_READY, revision=OuterRef("pk"))
        .values("revision")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return revisions.annotate(ready_replicas=Coalesce(Subquery(ready_replicas), 0)).annotate(
        ready=Case(
            When(
                port__isnull=False,
                then=Case(
                    When(ready_replicas__gte=F("replicas"), then=Value(True)),
                    default=Value(False),
                ),
            ),
            default=REVISION_READY,
            output_field=BooleanField(),
        )
    )


def deployments_with_status(deployments: QuerySet[Deployment]) -> QuerySet[Deployment]:
    """Each deployment with ``status``: ``stopped``; ``ready`` while its current revision
    (the newest live one) is Ready (L2, S1); else ``degraded``. The API, the admin list and
    its change page all read it from here."""
    current = _with_ready(
        Revision.objects.filter(deployment=OuterRef("pk"), state=RevisionState.LIVE)
    ).order_by("-number")
    return deployments.alias(current_ready=Subquery(current.values("ready")[:1])).annotate(
        status=Case(
            When(state=DeploymentState.STOPPED, then=Value(DeploymentStatus.STOPPED)),
            When(current_ready=True, then=Value(DeploymentStatus.READY)),
            default=Value(DeploymentStatus.DEGRADED),
        )
    )


def environment_resolve(environment: Environment) -> Node:
    """P5, L3: a node of the environment's Fleet answering right now — a live lease and env
    not quiet — resolved per job, never cached; and every gate admission runs, again: the
    Fleet still open to the project (F8, else the same 404) and still able to env."""
    admit_named(environment.project, environment.fleet_id, Need(FleetCapability.ENV))
    now = timezone.now()
    answering = (
        Node.objects.filter(
            fleet_id=environment.fleet_id,
            quiet_env=False,
            sessions__closed_at__isnull=True,
            sessions__lease_expires_at__gt=now,
        )
        .exclude(
            scheduling_state__in=(
                SchedulingState.GONE,
                SchedulingState.REMOVED,
                SchedulingState.DRAINED,
            )
        )
        .order_by("-sessions__last_heartbeat_at")
        .first()
    )
    if answering is None or environment.fleet.state != FleetState.ACTIVE:
        raise PlacementRefused(
            f"No node of Fleet '{environment.fleet_id}' answers for env right now (rule L3).",
            reason=Refusal.NO_NODE_ANSWERING,
        )
    return answering


def delivery_of(fleet, volumes, datasets) -> list[dict]:
    """P3: how each volume and dataset reaches a job through its Fleet's delivery."""
    root = str(fleet.config.get("storage_root") or DEFAULT_STORAGE_ROOT).rstrip("/")
    reached = []
    for kind, records in (("volume", volumes), ("dataset", datasets)):
        for record in records:
            entry = {"kind": kind, "name": record.name, "delivery": fleet.delivery}
            if fleet.delivery == FleetDelivery.SHARED_MOUNT:
                entry["path"] = f"{root}/{record.project.slug}/{kind}s/{record.name}"
            else:
                entry["uri"] = record.uri or (
                    f"{settings.TUNEPLANE_PUBLIC_URL.rstrip('/')}"
                    f"/objects/{record.project.slug}/{kind}s/"
                    f"{record.name}"
                )
            reached.append(entry)
    return reached


def queue_position(record) -> dict | None:
    """Where a queued job stands (Q7's dry run; Q8's positions are the allocator's): its
    place in its project's queue (priority, then admission order) and in its Fleet's
    (admission order). None for what is not a queued job. Four queries."""
    if not isinstance(record, Job) or record.state != JobState.QUEUED:
        return None
    ahead_in_fleet = ahead_in_project = 0
    for model in (TrainingJob, LifecycleJob):
        queued = model.objects.filter(fleet_id=record.fleet_id, state=JobState.QUEUED).exclude(
            pk=record.pk if isinstance(record, model) else None
        )
        ahead_in_fleet += queued.filter(created_at__lte=record.created_at).count()
        ahead_in_project += (
            queued.filter(project_id=record.project_id)
            .filter(
                Q(priority__gt=record.priority)
                | Q(priority=record.priority, created_at__lte=record.created_at)
            )
            .count()
        )
    return {"position_in_project": ahead_in_project + 1, "position_in_fleet": ahead_in_fleet + 1}
