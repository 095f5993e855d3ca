"""The work section of a node Fleet's page: its queue, and each node's cards held and free
(R1, R7) — read from the allocator's own rows, so the page and the allocator agree."""

from django.db.models import Count

from fleets.choices import FleetKind
from nodes.choices import SchedulingState

from .choices import RUN_LIVE, JobState
from .models import CardHold, LifecycleJob, Member, TrainingJob
from .services.quotas import quota_rows


def fleet_work_section(fleet) -> dict | None:
    if fleet.kind != FleetKind.NODE:
        return None
    held = dict(
        CardHold.objects.filter(node__fleet=fleet)
        .values("node_id")
        .annotate(n=Count("id"))
        .values_list("node_id", "n")
    )
    members = dict(
        Member.objects.filter(node__fleet=fleet, state__in=RUN_LIVE)
        .values("node_id")
        .annotate(n=Count("id"))
        .values_list("node_id", "n")
    )
    rows = []
    for node in fleet.nodes.exclude(scheduling_state=SchedulingState.REMOVED).order_by(
        "hostname", "id"
    ):
        total = len(node.inventory.get("devices", []))
        rows.append(
            {
                "node": node,
                "cards": total,
                "held": held.get(node.id, 0),
                "free": max(0, total - held.get(node.id, 0)),
                "members": members.get(node.id, 0),
            }
        )
    counts = {
        state: sum(
            model.objects.filter(fleet=fleet, state=state).count()
            for model in (TrainingJob, LifecycleJob)
        )
        for state in (JobState.QUEUED, JobState.STARTING, JobState.RUNNING, JobState.PREEMPTING)
    }
    return {"template": "admin/placement/fleet_work.html", "rows": rows, "counts": counts}


def fleet_quota_section(fleet) -> dict | None:
    """Q1, Q3: per quota, what it is guaranteed, may hold, holds, borrows and has queued, in
    fair-share order (the first borrows next)."""
    if fleet.kind != FleetKind.NODE:
        return None
    rows = quota_rows(fleet)
    if not rows:
        return None
    rows.sort(key=lambda row: (row["fair_share"], row["project"], row["series"]))
    return {"template": "admin/placement/fleet_quotas.html", "rows": rows}
