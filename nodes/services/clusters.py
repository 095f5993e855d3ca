"""Cluster Fleets' snapshots: read from their managers on a schedule (DESIGN.md §6, L1).

A read that fails keeps the last good machines and their observation time, so the Fleet
stops fitting once that ages past the freshness window, and the page says why. Nothing is
audited per read (they are observations, every few seconds); the manager becoming
unreachable and reachable again is.
"""

import logging

from django.db import transaction
from django.utils import timezone

from audit.services import Actor, audit_record
from fleets.choices import FleetKind
from fleets.models import Fleet

from ..backends import BackendError, backend_for
from ..models import ClusterSnapshot
from .hardware import card_names_remember

logger = logging.getLogger("tuneplane.clusters")

CLUSTER_KINDS = (FleetKind.SLURM, FleetKind.KUBERNETES)


def cluster_refresh(fleet: Fleet) -> ClusterSnapshot:
    """Read one cluster Fleet's machines now and keep what was read, or why it could not be."""
    now = timezone.now()
    try:
        machines, error = [m.as_dict() for m in backend_for(fleet).read()], ""
    except BackendError as exc:
        machines, error = None, str(exc)
    with transaction.atomic():
        snapshot, _ = ClusterSnapshot.objects.select_for_update().get_or_create(fleet=fleet)
        was_failing, error_before = bool(snapshot.error), snapshot.error
        snapshot.attempted_at = now
        if error:
            snapshot.error = error[:2000]
            snapshot.error_since = snapshot.error_since if was_failing else now
        else:
            snapshot.machines, snapshot.observed_at = machines, now
            snapshot.error, snapshot.error_since = "", None
            card_names_remember(
                (card["name"] for machine in machines for card in machine["cards"]), now
            )
        snapshot.save()
        if bool(error) != was_failing:
            audit_record(
                actor=Actor.system("clusters"),
                target=fleet,
                action="fleet.cluster_unreachable" if error else "fleet.cluster_reachable",
                before={"reachable": not was_failing, "error": error_before},
                after={
                    "reachable": not error,
                    "error": error,
                    **({} if error else {"machines": len(machines)}),
                },
            )
    if error:
        logger.warning("cluster Fleet %s: %s", fleet.id, error)
    return snapshot


def clusters_refresh() -> dict:
    """Every cluster Fleet, each on its own: one manager down never stops the others. Draining
    and disabled Fleets are read too — reading touches nothing (D1)."""
    read = failed = 0
    for fleet in Fleet.objects.filter(kind__in=CLUSTER_KINDS).order_by("id"):
        try:
            snapshot = cluster_refresh(fleet)
        except Exception:  # a manager's surprise answer, a Fleet deleted meanwhile
            logger.exception("cluster Fleet %s could not be read", fleet.id)
            failed += 1
            continue
        read, failed = (read + 1, failed) if not snapshot.error else (read, failed + 1)
    return {"read": read, "failed": failed}
