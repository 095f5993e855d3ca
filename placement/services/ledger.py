"""What one allocator pass decides by on a Fleet with quotas (Q3): its quotas as a ledger
(placement.sharing.Book), the cards each holds, and each project's decayed use brought
forward to the pass and written back."""

from django.conf import settings

from fleets.models import Fleet

from ..choices import Cleanup
from ..models import Member, Quota, Usage
from ..sharing import Book, QuotaRow, brought_forward, time_constant


def holdings(fleet: Fleet) -> dict:
    """The cards each quota of the Fleet holds now, by (project, series): one query, what
    the allocator and the quotas' readers both count. What a quota borrows is computed from
    it (placement.sharing.borrowed), never summed from members placed as borrowed."""
    held: dict = {}
    for project_id, series, cards in Member.objects.filter(
        node__fleet=fleet, cleanup=Cleanup.PENDING, project__isnull=False
    ).values_list("project_id", "quota_series", "cards"):
        key = (project_id, series)
        held[key] = held.get(key, 0) + len(cards)
    return held


def fair_share_tau() -> float:
    return time_constant(settings.TUNEPLANE_FAIR_SHARE_HALF_LIFE)


def pass_book(fleet: Fleet, now) -> Book | None:
    """The ledger one allocator pass decides by (Q3), None for a Fleet without quotas:
    its quotas, the cards each holds, each project's use brought forward to ``now`` and
    written back (the pass holds the Fleet's lock). Four statements."""
    rows = {
        (project_id, series): QuotaRow(guaranteed, limit, weight)
        for project_id, series, guaranteed, limit, weight in Quota.objects.filter(
            fleet=fleet
        ).values_list("project_id", "series", "guaranteed", "limit", "weight")
    }
    if not rows:
        return None
    tau = fair_share_tau()
    held = holdings(fleet)
    book = Book(rows=rows, held=held, tau=tau)
    by_project: dict[int, int] = {}
    for (project_id, _), cards in held.items():
        by_project[project_id] = by_project.get(project_id, 0) + cards
    usage = {u.project_id: u for u in Usage.objects.filter(fleet=fleet)}
    for project_id in by_project.keys() | usage.keys():
        record = usage.get(project_id)
        if record is None:
            usage[project_id] = record = Usage(fleet=fleet, project_id=project_id, as_of=now)
        elapsed = (now - record.as_of).total_seconds()
        record.card_seconds = brought_forward(
            record.card_seconds, by_project.get(project_id, 0), elapsed, tau
        )
        record.as_of = now
        book.usage[project_id] = record.card_seconds
    Usage.objects.bulk_create(
        list(usage.values()),
        update_conflicts=True,
        unique_fields=["fleet", "project"],
        update_fields=["card_seconds", "as_of"],
    )
    return book
