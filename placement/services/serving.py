"""Deployments on node Fleets: replicas as their nodes report them, rollouts, stops (S1–S3).

A revision's replicas are members with a revision instead of an attempt. The allocator
places each with its cards and port; the agent starts it, restarts it whenever its process
exits and probes its readiness (S1); its node reports only what changes — running, ready or
not with the probe's error, restarts — so nothing is written while nothing changes. A
replica ends only when the console stops it: a deployment never moves by itself (S3).

A new revision's replicas start beside the old ones; an old replica is stopped only when a
new one is Ready, so a rollout never drops below the Ready count it had; a new revision not
wholly Ready within TUNEPLANE_ROLLOUT_DEADLINE is rolled back — its replicas stopped and
cleaned, the old revision untouched — and the deployment says why (S2).

Every writer here locks in one order: the deployment, its revisions, their members (after
a node command, which a report has locked first).
"""

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from audit.services import Actor, audit_record
from fleets.choices import FleetCapability, FleetKind
from nodes.models import NodeCommand
from nodes.selectors import nodes_placeable
from tuneplane.errors import Conflict, ValidationFailed
from tuneplane.lifecycle import move

from ..admission import Need, admit_named
from ..choices import (
    DEPLOYMENT_LIFECYCLE,
    REVISION_LIFECYCLE,
    RUN_LIVE,
    Cleanup,
    DeploymentState,
    RevisionState,
)
from ..models import Deployment, Member, Revision
from ..runspec import checked_serve, require_servable
from ..selectors import replica_ready
from .members import member_follow, members_clean, members_stop
from .passes import allocate_on_commit

SERVING = Actor.system("serving")


def locked_deployment(deployment_id: int):
    """The deployment, its revisions by number and their members, locked in that order."""
    deployment = Deployment.objects.select_for_update().get(pk=deployment_id)
    revisions = list(deployment.revisions.select_for_update().order_by("number"))
    members = list(
        Member.objects.select_for_update(of=("self",))
        .select_related("node")  # Ready reads it; its row is not locked
        .filter(revision__deployment=deployment)
        .order_by("revision_id", "rank")
    )
    return deployment, revisions, members


def deployment_member_reported(deployment_id: int, command: NodeCommand, before: dict) -> None:
    """A node's report moved a replica's start command: the replica follows
    (members.member_follow), then its deployment's rollout."""
    deployment, revisions, members = locked_deployment(deployment_id)
    member = next(m for m in members if m.command_id == command.pk)
    member_follow(member, command, before, actor=SERVING, fleet_id=deployment.fleet_id)
    _settle(deployment, revisions, members, timezone.now())


def _settle(deployment: Deployment, revisions, members, now) -> None:
    """What follows from the replicas now: ended ones cleaned up, a rollout's progress (S2)."""
    members_clean(members, now)
    live = [r for r in revisions if r.state == RevisionState.LIVE]
    if len(live) < 2:
        return
    newest, older = live[-1], live[:-1]
    of = {r.pk: [m for m in members if m.revision_id == r.pk] for r in revisions}
    ready_new = sum(1 for m in of[newest.pk] if replica_ready(m))
    if ready_new >= newest.replicas:
        for revision in older:  # the new revision serves in full: the old ones go
            _revision_end(revision, RevisionState.RETIRED, f"replaced by {newest.number}", now)
            members_stop(of[revision.pk], now)
        return
    old = [m for r in older for m in of[r.pk]]
    # This rollout's stops only: one an earlier, rolled-back rollout made is not one of them.
    stopped = sum(
        1
        for m in old
        if m.stop_requested_at is not None and m.stop_requested_at >= newest.created_at
    )
    # An old replica per new Ready one, the not-Ready first: never below the Ready count.
    candidates = sorted(
        (m for m in _live(old) if m.stop_requested_at is None), key=lambda m: replica_ready(m)
    )
    members_stop(candidates[: max(0, ready_new - stopped)], now)


def _live(members) -> list[Member]:
    return [m for m in members if m.state in RUN_LIVE]


def _revision_end(revision: Revision, state: str, reason: str, now) -> None:
    move(
        revision,
        REVISION_LIFECYCLE,
        state,
        actor=SERVING,
        reason=reason[:300],
        fields={"ended_at": now},
    )


def revisions_stop(*, deployment: Deployment, actor: Actor) -> None:
    """A stopped deployment: every revision stopped, every replica stopped and cleaned up;
    its cards are released after the cleanup (R7). Call inside a transaction."""
    now = timezone.now()
    deployment, revisions, members = locked_deployment(deployment.pk)
    for revision in revisions:
        if revision.state == RevisionState.LIVE:
            _revision_end(revision, RevisionState.STOPPED, f"deployment stopped by {actor}", now)
    members_stop(members, now)
    members_clean(members, now)


def revision_create(*, actor: Actor, deployment: Deployment, **serve) -> Revision:
    """S2: a new revision of a live deployment on a node Fleet; what it does not say is as
    the current revision has it. Its replicas start beside the old ones."""
    with transaction.atomic():
        deployment, revisions, _ = locked_deployment(deployment.pk)
        if deployment.state != DeploymentState.LIVE:
            raise Conflict("The deployment is stopped; submit a new one.", code="stopped")
        if deployment.fleet.kind != FleetKind.NODE:
            raise Conflict(
                f"Fleet '{deployment.fleet_id}' is a {deployment.fleet.kind} Fleet: revisions "
                "roll out on node Fleets, where the console's agents serve them.",
                code="not_a_node_fleet",
            )
        current = next((r for r in reversed(revisions) if r.state == RevisionState.LIVE), None)
        base = current or revisions[-1]
        inherited = {
            name: getattr(base, name)
            for name in ("command", "script", "image", "env", "cpus", "memory_bytes", "port")
            + ("readiness_path", "replicas")
        }
        if "command" in serve or "script" in serve:
            inherited.update(command=[], script="")
        fields = checked_serve(**{**inherited, **serve})
        require_servable(fields)
        # Every gate admission runs, again for each revision: the Fleet still open to the
        # project (F8, else the same 404), still able to serve, and its cards fit (P7).
        admit_named(
            deployment.project,
            deployment.fleet_id,
            Need(
                FleetCapability.SERVE,
                deployment.series,
                deployment.cards,
                kinds=(FleetKind.NODE,),
                container=bool(fields["image"]),
            ),
        )
        _port_free_somewhere(deployment, fields["port"])
        revision = Revision.objects.create(
            deployment=deployment, number=revisions[-1].number + 1, **fields
        )
        audit_record(
            actor=actor,
            action="revision.created",
            target=revision,
            after={
                "number": revision.number,
                "replicas": revision.replicas,
                "env": sorted(fields["env"]),
            },
        )
        allocate_on_commit(deployment.fleet_id)
    return revision


def _port_free_somewhere(deployment: Deployment, port: int) -> None:
    """S2: a new revision's replicas start beside the old ones, one port per node. On a
    port that the deployment's own replicas hold on every node that could take one, it
    could never be placed: refused now, not rolled back at the deadline."""
    placeable = set(nodes_placeable([deployment.fleet_id]).values_list("pk", flat=True))
    holding = set(
        Member.objects.filter(
            revision__deployment=deployment, cleanup=Cleanup.PENDING, port=port
        ).values_list("node_id", flat=True)
    )
    if placeable and placeable <= holding:
        raise ValidationFailed(
            f"port: every node of Fleet '{deployment.fleet_id}' that could run a replica "
            f"already serves this deployment on port {port}; a new revision starts beside "
            "the old one, so give it another port (rule S2).",
            field="port",
            rule="S2",
        )


def rollouts_settle(*, now=None) -> dict[str, int]:
    """The beat's pass: a new revision not wholly Ready within its deadline is rolled back —
    its replicas stopped and cleaned, the old revision untouched — and the deployment says
    why (S2). Each deployment in a transaction of its own."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.TUNEPLANE_ROLLOUT_DEADLINE)
    late = (
        Deployment.objects.filter(state=DeploymentState.LIVE)
        .annotate(live=Count("revisions", filter=Q(revisions__state=RevisionState.LIVE)))
        .filter(live__gt=1)
        .values_list("pk", flat=True)
    )
    rolled_back = 0
    for deployment_id in list(late):
        with transaction.atomic():
            deployment, revisions, members = locked_deployment(deployment_id)
            live = [r for r in revisions if r.state == RevisionState.LIVE]
            newest = live[-1] if len(live) > 1 else None
            if newest is None or newest.created_at >= cutoff:
                continue
            mine = [m for m in members if m.revision_id == newest.pk]
            ready = sum(1 for m in mine if replica_ready(m))
            why = _not_ready_reason(mine)
            reason = (
                f"revision {newest.number} rolled back: {ready} of {newest.replicas} replicas "
                f"Ready within {settings.TUNEPLANE_ROLLOUT_DEADLINE}s{why} (rule S2)"
            )
            _revision_end(newest, RevisionState.ROLLED_BACK, reason, now)
            members_stop(mine, now)
            before = {"reason": deployment.reason}
            deployment.reason = reason[:300]
            deployment.save(update_fields=["reason"])
            audit_record(
                actor=SERVING,
                action="deployment.rolled_back",
                target=deployment,
                before=before,
                after={"reason": deployment.reason, "revision": newest.number},
            )
            rolled_back += 1
    return {"rolled_back": rolled_back}


def _not_ready_reason(members) -> str:
    for member in members:
        if not replica_ready(member) and (member.detail or member.reason):
            return f"; replica {member.rank}: {member.detail or member.reason}"
    return "" if members else "; no replica could be placed"


def stopped_deployments_release(*, actor: Actor, fleet) -> dict:
    """F7: a Fleet being deleted lets go of its stopped deployments, every replica of which
    its node has cleaned up (the blocker keeps the others): each deleted, with its
    revisions and replicas, and audited. Called inside the deletion's transaction."""
    stopped = Deployment.objects.filter(fleet=fleet, state=DeploymentState.STOPPED).exclude(
        revisions__members__cleanup=Cleanup.PENDING
    )
    deleted = []
    for deployment in stopped.select_for_update(of=("self",)).order_by("pk"):
        audit_record(
            actor=actor,
            action="deployment.deleted",
            target=deployment,
            before={"name": deployment.name, "state": deployment.state, "fleet": fleet.id},
        )
        deleted.append(deployment.pk)
        deployment.delete()
    return {"deployments_deleted": deleted} if deleted else {}


def deployment_update(
    *, actor: Actor, deployment: Deployment, state: str | None = None, fleet: str | None = None
) -> Deployment:
    """A deployment never changes Fleet (P2); it may be stopped: on a node Fleet every
    replica is then stopped and cleaned up, and its cards released after the cleanup."""
    if fleet is not None and fleet != deployment.fleet_id:
        raise ValidationFailed(
            "fleet: a deployment never changes Fleet; create a new "
            "deployment on the other Fleet (rule P2).",
            field="fleet",
            rule="P2",
        )
    if state is not None and state not in DeploymentState.values:
        raise ValidationFailed(
            f"state must be one of {', '.join(DeploymentState.values)}.", field="state"
        )
    with transaction.atomic():
        deployment = Deployment.objects.select_for_update().get(pk=deployment.pk)
        if state is not None and state != deployment.state:
            if state == DeploymentState.LIVE:
                raise ValidationFailed(
                    "state: a stopped deployment stays stopped; submit a new one.",
                    field="state",
                )
            move(
                deployment,
                DEPLOYMENT_LIFECYCLE,
                state,
                actor=actor,
                action="deployment.state_changed",
            )
            revisions_stop(deployment=deployment, actor=actor)
    return deployment
