"""Every write to a Fleet: validated, in one transaction, audited (A1)."""

import logging

from django.db import IntegrityError, connection, transaction

from audit.services import Actor, audit_record
from tuneplane.deployment_settings import check_config
from tuneplane.errors import Conflict
from tuneplane.models import Project

from . import rules
from .choices import FleetState, FleetVisibility
from .deletion import deletion_blockers, deletion_releases
from .models import Fleet
from .selectors import fleet_config_warnings

logger = logging.getLogger("tuneplane.fleets")


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset()


def _log_config_warnings(fleet: Fleet) -> None:
    for warning in fleet_config_warnings(fleet):
        logger.warning(
            "Fleet %s: %s",
            fleet.id,
            warning.message,
            extra={"fleet": fleet.id, "config_key": warning.key},
        )


def fleet_create(
    *,
    actor,
    id: str,
    kind: str,
    delivery: str | None = None,
    capabilities=(),
    visibility: str = FleetVisibility.PUBLIC,
    project: Project | None = None,
    state: str = FleetState.ACTIVE,
    config: dict | None = None,
) -> Fleet:
    rules.validate_id(id)
    rules.validate_kind(kind)
    fleet = Fleet(
        id=id,
        kind=kind,
        delivery=rules.resolve_delivery(kind, delivery),
        capabilities=rules.normalize_capabilities(capabilities),
        visibility=visibility,
        project=project,
        state=rules.validate_state(state),
        config=check_config(kind, {} if config is None else config),
    )
    rules.validate_visibility(visibility, project)
    already = Conflict(f"A Fleet with id '{id}' already exists.", code="already_exists", field="id")
    with transaction.atomic():
        if Fleet.objects.filter(pk=id).exists():
            raise already
        try:
            with transaction.atomic():
                fleet.save(force_insert=True)
        except IntegrityError:
            raise already from None
        audit_record(actor=actor, action="fleet.created", target=fleet, after=fleet.snapshot())
    _log_config_warnings(fleet)
    return fleet


def fleet_update(
    *,
    actor,
    fleet: Fleet,
    capabilities=UNSET,
    visibility=UNSET,
    project=UNSET,
    state=UNSET,
    config=UNSET,
    kind=UNSET,
    delivery=UNSET,
    action: str = "fleet.updated",
) -> Fleet:
    """Change what may change. A refused field leaves the whole change unapplied (F1)."""
    with transaction.atomic():
        fleet = (
            Fleet.objects.select_for_update(of=("self",)).select_related("project").get(pk=fleet.pk)
        )
        before = fleet.snapshot()
        if kind is not UNSET:
            rules.refuse_change("kind", fleet.kind, kind)
        if delivery is not UNSET:
            rules.refuse_change("delivery", fleet.delivery, delivery)
        if capabilities is not UNSET:
            fleet.capabilities = rules.normalize_capabilities(capabilities)
        if state is not UNSET:
            fleet.state = rules.validate_state(state)
        if config is not UNSET:
            fleet.config = check_config(fleet.kind, config)
        if visibility is not UNSET:
            rules.validate_choice("visibility", visibility, FleetVisibility)
            fleet.visibility = visibility
            if visibility == FleetVisibility.PUBLIC and project is UNSET:
                project = None
        if project is not UNSET:
            fleet.project = project
        rules.validate_visibility(fleet.visibility, fleet.project)
        after = fleet.snapshot()
        if after != before:
            fleet.save()
            audit_record(actor=actor, action=action, target=fleet, before=before, after=after)
    _log_config_warnings(fleet)
    return fleet


def fleet_set_state(*, actor: Actor, fleet: Fleet, state: str) -> Fleet:
    """Activate, drain or disable a Fleet. Draining and disabling kill nothing (D1)."""
    return fleet_update(actor=actor, fleet=fleet, state=state, action="fleet.state_changed")


def fleet_hold(fleet_id: str) -> bool:
    """Keep a Fleet from being deleted until this transaction ends, without keeping anyone
    else from holding it or changing it: what a write that will reference the Fleet takes
    first, so that it and a deletion queue in one order instead of deadlocking (F7).
    Whether the Fleet exists."""
    if connection.vendor != "postgresql":  # SQLite's write transactions are serial already
        return Fleet.objects.filter(pk=fleet_id).exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM fleets_fleet WHERE id = %s FOR KEY SHARE", [fleet_id])
        return cursor.fetchone() is not None


def fleet_delete(*, actor: Actor, fleet: Fleet) -> None:
    """F7: deletable only when no registered blocker objects. What outlives the Fleet (a
    removed node's record) is let go of first, and the deletion's event says what."""
    with transaction.atomic():
        fleet = (
            Fleet.objects.select_for_update(of=("self",)).select_related("project").get(pk=fleet.pk)
        )
        blockers = deletion_blockers(fleet)
        if blockers:
            raise Conflict(
                f"Fleet '{fleet.id}' cannot be deleted (rule F7): it still has "
                f"{'; '.join(blockers)}.",
                rule="F7",
                blockers=blockers,
            )
        before = {**fleet.snapshot(), **deletion_releases(actor=actor, fleet=fleet)}
        audit_record(actor=actor, action="fleet.deleted", target=fleet, before=before)
        fleet.delete()
