"""The hardware registry: card names as machines and clusters report them, and the series an
admin maps each to (J4). Mapping takes effect on every node at once, without a re-join."""

import logging

from django.core.exceptions import ValidationError
from django.db import transaction

from audit.services import Actor, audit_record
from tuneplane.errors import Conflict, ValidationFailed
from tuneplane.windows import count_in_window

from ..choices import SchedulingState
from ..models import CardAlias, HardwareSeries, Node
from ..selectors import card_series, cards_summary

logger = logging.getLogger("tuneplane.nodes")


def _clean(record) -> None:
    """The model's own checks (slug shape, uniqueness), as an error naming the field."""
    try:
        record.full_clean()
    except ValidationError as error:
        field, messages = next(iter(error.message_dict.items()))
        raise ValidationFailed(f"{field}: {' '.join(messages)}", field=field) from None


# New card names one node may add to the registry in an hour: a real machine has a few; a
# node inventing names each report would fill the admin's card list.
NEW_CARD_NAMES_PER_NODE_HOUR = 16


def card_names_remember(names, now, *, node_id: str = "") -> None:
    """Card names no one has seen yet become unmapped registry entries for an admin to map
    (J4): from a join, an inventory report over the stream, or a cluster's snapshot. An
    observation, not audited: the mapping an admin makes of it is. What ``node_id`` adds is
    limited to NEW_CARD_NAMES_PER_NODE_HOUR; past it, its names stay unknown (and unplaced
    for a pinned series) until the next hour."""
    names = sorted(set(names))
    if node_id and names:
        known = set(CardAlias.objects.filter(name__in=names).values_list("name", flat=True))
        names = [name for name in names if name not in known]
        if names:
            used = count_in_window("card-names", node_id, seconds=3600, delta=len(names))
            allowed = max(NEW_CARD_NAMES_PER_NODE_HOUR - (used - len(names)), 0)
            if allowed < len(names):
                logger.warning(
                    "node %s: %d new card names past its hourly %d not registered",
                    node_id,
                    len(names) - allowed,
                    NEW_CARD_NAMES_PER_NODE_HOUR,
                )
            names = names[:allowed]
    CardAlias.objects.bulk_create(
        [CardAlias(name=name, first_seen_at=now) for name in names], ignore_conflicts=True
    )


def card_alias_map(*, actor: Actor, alias: CardAlias, series: HardwareSeries | None) -> CardAlias:
    """Map a card name to a series (or unmap it); nodes reporting it follow at once (J4)."""
    with transaction.atomic():
        alias = CardAlias.objects.select_for_update().get(pk=alias.pk)
        before = {"series": alias.series.slug if alias.series_id else None}
        alias.series = series
        alias.save(update_fields=["series"])
        followed = _nodes_follow_mapping(alias.name)
        audit_record(
            actor=actor,
            action="card_alias.mapped",
            target=alias,
            before=before,
            after={"series": series.slug if series else None, "nodes": followed},
        )
    return alias


def _nodes_follow_mapping(name: str) -> int:
    """The nodes reporting a card name take its new mapping into their card summary."""
    nodes = [
        node
        for node in Node.objects.exclude(scheduling_state=SchedulingState.REMOVED).only(
            "id", "inventory", "unhealthy_cards"
        )
        if name in node.card_names()
    ]
    series = card_series(card for node in nodes for card in node.card_names())
    for node in nodes:
        for attribute, value in cards_summary(node.inventory, series, node.unhealthy_cards).items():
            setattr(node, attribute, value)
    Node.objects.bulk_update(nodes, ["series_cards", "card_count"], batch_size=1000)
    return len(nodes)


def series_create(*, actor: Actor, slug: str, name: str, vendor: str = "") -> HardwareSeries:
    with transaction.atomic():
        series = HardwareSeries(slug=slug, name=name, vendor=vendor)
        _clean(series)
        series.save()
        audit_record(
            actor=actor,
            action="hardware_series.created",
            target=series,
            after={"slug": slug, "name": name, "vendor": vendor},
        )
    return series


def series_update(
    *, actor: Actor, series: HardwareSeries, name: str, vendor: str
) -> HardwareSeries:
    """Jobs pin a series by its slug and nodes' card summaries are kept under it: only its
    name and vendor change."""
    with transaction.atomic():
        series = HardwareSeries.objects.select_for_update().get(pk=series.pk)
        before = {"name": series.name, "vendor": series.vendor}
        after = {"name": name, "vendor": vendor}
        if before != after:
            series.name, series.vendor = name, vendor
            _clean(series)
            series.save(update_fields=["name", "vendor"])
            audit_record(
                actor=actor,
                action="hardware_series.updated",
                target=series,
                before=before,
                after=after,
            )
    return series


def card_alias_add(*, actor: Actor, name: str, series: HardwareSeries | None = None) -> CardAlias:
    """A card name added by hand, before any machine reports it: recorded unmapped, then
    mapped as any other (so nodes that already report it follow, J4)."""
    with transaction.atomic():
        alias = CardAlias(name=name)
        _clean(alias)
        alias.save()
        audit_record(
            actor=actor,
            action="card_alias.added",
            target=alias,
            after={"name": name, "series": None},
        )
        if series is not None:
            alias = card_alias_map(actor=actor, alias=alias, series=series)
    return alias


def card_alias_delete(*, actor: Actor, alias: CardAlias) -> None:
    """Only an unmapped name goes: unmapping goes through the mapping, so nodes follow it."""
    with transaction.atomic():
        alias = CardAlias.objects.select_for_update().filter(pk=alias.pk).first()
        if alias is None:
            return
        if alias.series_id is not None:
            raise Conflict(
                f"Card name '{alias.name}' is mapped to a series: unmap it first.", rule="J4"
            )
        audit_record(
            actor=actor,
            action="card_alias.deleted",
            target=alias,
            before={"name": alias.name, "series": None},
        )
        alias.delete()


def series_delete(*, actor: Actor, series: HardwareSeries) -> None:
    """A series no card name maps to (the mapping protects it), so no node counts cards in
    it; a job that pinned it is refused as for any series no node has."""
    with transaction.atomic():
        series = HardwareSeries.objects.select_for_update().filter(pk=series.pk).first()
        if series is None:
            return
        if series.aliases.exists():
            raise Conflict(
                f"Series '{series.slug}' has card names mapped to it: map them elsewhere first.",
                rule="J4",
            )
        audit_record(
            actor=actor,
            action="hardware_series.deleted",
            target=series,
            before={"slug": series.slug, "name": series.name, "vendor": series.vendor},
        )
        series.delete()
