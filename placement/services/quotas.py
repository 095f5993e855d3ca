"""A Fleet's quotas (Q1): replaced as a whole by an administrator, audited; read with what
each quota holds, borrows and has queued. What an allocator pass reads of them is
placement.services.ledger's.

A Fleet with no quotas is first come, first served, as before quotas; on a Fleet that has
quotas, a project without one is guaranteed 0 cards, unlimited, weight 1.
"""

from dataclasses import dataclass

from django.db import transaction

from audit.services import Actor, audit_record
from fleets.models import Fleet
from nodes.models import HardwareSeries
from tuneplane.errors import ValidationFailed
from tuneplane.models import Project

from ..choices import JobState
from ..models import Quota, Usage
from ..sharing import Book, QuotaRow
from .ledger import fair_share_tau, holdings
from .passes import allocate_on_commit
from .waiting import JOB_MODELS


@dataclass(frozen=True)
class QuotaSpec:
    """One row of a PUT's ``quotas``, as the serializer read it."""

    project: str
    series: str = ""
    guaranteed: int = 0
    limit: int | None = None
    weight: int = 1


def quotas_replace(*, actor: Actor, fleet: Fleet, specs: list[QuotaSpec]) -> list[Quota]:
    """Q1: the Fleet's quotas become ``specs``, as a whole, in one transaction and one audit
    event that shows them before and after. Each row names a project and a series that
    exist, its limit is at least its guarantee, and no (project, series) is named twice.
    The same quotas again change nothing and record nothing."""
    projects = {p.slug: p for p in Project.objects.filter(slug__in={s.project for s in specs})}
    known_series = set(
        HardwareSeries.objects.filter(slug__in={s.series for s in specs if s.series}).values_list(
            "slug", flat=True
        )
    )
    seen = set()
    for at, spec in enumerate(specs):
        where = f"quotas[{at}]"
        if spec.project not in projects:
            raise ValidationFailed(
                f"{where}.project: no project '{spec.project}'.", field=f"{where}.project"
            )
        if spec.series and spec.series not in known_series:
            raise ValidationFailed(
                f"{where}.series: no hardware series '{spec.series}' (\"\" for any card).",
                field=f"{where}.series",
            )
        if spec.limit is not None and spec.limit < spec.guaranteed:
            raise ValidationFailed(
                f"{where}.limit: {spec.limit} is less than its guaranteed {spec.guaranteed} "
                "(a limit is at least the guarantee, or null for unlimited).",
                field=f"{where}.limit",
            )
        if (spec.project, spec.series) in seen:
            raise ValidationFailed(
                f"{where}: project '{spec.project}' has a quota for "
                f"{spec.series or 'any card'} already.",
                field=where,
            )
        seen.add((spec.project, spec.series))
    with transaction.atomic():
        Fleet.objects.select_for_update().filter(pk=fleet.pk).first()
        before = [_view(quota) for quota in fleet_quotas(fleet)]
        wanted = sorted(
            (
                {
                    "project": spec.project,
                    "series": spec.series,
                    "guaranteed": spec.guaranteed,
                    "limit": spec.limit,
                    "weight": spec.weight,
                }
                for spec in specs
            ),
            key=lambda row: (row["project"], row["series"]),
        )
        if wanted == before:  # nothing changes: nothing written, nothing recorded
            return fleet_quotas(fleet)
        Quota.objects.filter(fleet=fleet).delete()
        created = Quota.objects.bulk_create(
            [
                Quota(
                    fleet=fleet,
                    project=projects[spec.project],
                    series=spec.series,
                    guaranteed=spec.guaranteed,
                    limit=spec.limit,
                    weight=spec.weight,
                )
                for spec in specs
            ]
        )
        audit_record(
            actor=actor,
            action="fleet.quotas_replaced",
            target=fleet,
            before={"quotas": before},
            after={"quotas": [_view(quota) for quota in created]},
        )
        allocate_on_commit(fleet.pk)  # a new quota may let waiting work start
    return fleet_quotas(fleet)


def fleet_quotas(fleet: Fleet, projects=None) -> list[Quota]:
    quotas = Quota.objects.filter(fleet=fleet).select_related("project")
    if projects is not None:
        quotas = quotas.filter(project__in=projects)
    return list(quotas.order_by("project__slug", "series"))


def _view(quota: Quota) -> dict:
    return {
        "project": quota.project.slug,
        "series": quota.series,
        "guaranteed": quota.guaranteed,
        "limit": quota.limit,
        "weight": quota.weight,
    }


def quota_rows(fleet: Fleet, projects=None) -> list[dict]:
    """Q1: each quota (of ``projects``, or all) with the cards it holds now, how many of
    them it borrows (what it holds above its guarantee now: placement.sharing.borrowed), how
    many its queued jobs ask, and its project's fair share (Q3: lower goes first): four
    queries, whatever the number of quotas. The API, the admin's Fleet page and the
    ``tuneplane_quota_*`` gauges all read these rows."""
    quotas = fleet_quotas(fleet, projects)
    held = holdings(fleet)
    book = Book(
        rows={(q.project_id, q.series): QuotaRow(q.guaranteed, q.limit, q.weight) for q in quotas},
        held=held,
        usage=dict(Usage.objects.filter(fleet=fleet).values_list("project_id", "card_seconds")),
        tau=fair_share_tau(),
    )
    queued: dict = {}
    for model in JOB_MODELS:
        for project_id, series, cards, nodes in model.objects.filter(
            fleet=fleet, state=JobState.QUEUED
        ).values_list("project_id", "series", "cards", "nodes"):
            key = book.key(project_id, series)
            queued[key] = queued.get(key, 0) + cards * nodes
    return [
        {
            **_view(quota),
            "in_use": held.get(key, 0),
            "borrowed": book.borrowed(key),
            "queued": queued.get(key, 0),
            "fair_share": round(book.share(key), 3),
        }
        for quota in quotas
        for key in [(quota.project_id, quota.series)]
    ]
