"""Nodes' telemetry, as gateways store it: each node's latest sample, checked, written in one
batch per gateway flush (like leases), and the cards' health judged from it (health.py).

A sample is an observation, not a change: storing it is not audited; a card's health
changing is, once (health.py). Bad telemetry — absurd numbers, more cards than a machine
has, a name longer than any card's — is refused whole, for that node alone.
"""

import json
import logging
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from tuneplane.errors import ValidationFailed

from .. import checks, quarantine
from ..choices import SchedulingState
from ..models import Node, NodeTelemetry
from .health import health_breakers_lock, node_cards_health

logger = logging.getLogger("tuneplane.nodes")

# More than any machine holds: a sample with more cards is refused, not truncated.
MAX_CARDS = 64
MAX_XID_CODES = 64
MAX_TEXT = 200
# What a card's and a host's numbers may be, at most; anything beyond is no reading.
TIB = 2**40
CARD_LIMITS = {
    "utilization_percent": 100.0,
    "memory_used_bytes": 16 * TIB,
    "memory_total_bytes": 16 * TIB,
    "temperature_celsius": 250.0,
    "power_watts": 10_000.0,
    "ecc_corrected": 2**48,
    "ecc_uncorrected": 2**48,
}
HOST_LIMITS = {
    "cpu_percent": 100.0,
    "memory_used_bytes": 1024 * TIB,
    "memory_total_bytes": 1024 * TIB,
}
SOURCES = ("", "nvml", "nvidia-smi", "file")
# XIDs after which a card is not to be trusted with new work (NVIDIA's XID catalogue: 48
# double-bit ECC, 63/64 row remapping, 74 NVLink, 79 fallen off the bus, 94/95 contained
# and uncontained ECC errors).
FATAL_XIDS = frozenset({48, 63, 64, 74, 79, 94, 95})


def _bounded(values: dict, limits: dict, what: str) -> dict:
    checked = {}
    for key, limit in limits.items():
        value = values.get(key, 0)
        if not isinstance(value, int | float) or not 0 <= value <= limit:
            raise ValidationFailed(f"{what}: {key} {value!r} is outside 0..{limit}", field=key)
        checked[key] = value
    return checked


def telemetry_checked(sample: dict) -> dict:
    """A sample as a node sent it (wire.telemetry_sample), or ValidationFailed naming why."""
    if sample.get("source") not in SOURCES:
        raise ValidationFailed(f"unknown telemetry source {sample.get('source')!r}", field="source")
    cards = sample.get("cards") or []
    if len(cards) > MAX_CARDS:
        raise ValidationFailed(
            f"{len(cards)} cards in one sample; at most {MAX_CARDS}", field="cards"
        )
    checked, seen = [], set()
    for card in cards:
        uuid, name = card.get("uuid") or "", card.get("name") or ""
        if not uuid or len(uuid) > MAX_TEXT or len(name) > MAX_TEXT or uuid in seen:
            raise ValidationFailed(f"a card's uuid {uuid[:80]!r} is empty, long or repeated")
        seen.add(uuid)
        xids = card.get("xid_counts") or {}
        if len(xids) > MAX_XID_CODES:
            raise ValidationFailed(f"card {uuid}: {len(xids)} XID codes", field="xid_counts")
        checked.append(
            {
                "index": int(card.get("index") or 0),
                "uuid": uuid,
                "name": name,
                **_bounded(card, CARD_LIMITS, f"card {uuid}"),
                "xid_counts": {str(code): int(count) for code, count in xids.items()},
                "fault": str(card.get("fault") or "")[:MAX_TEXT],
            }
        )
    return {
        "source": sample.get("source") or "",
        "cards": sorted(checked, key=lambda card: card["index"]),
        "host": _bounded(sample, HOST_LIMITS, "host"),
    }


def _new_fatal_xids(card: dict, before: dict | None) -> list[int]:
    """Fatal XIDs counted since the stored sample (a lower count: the agent restarted)."""
    earlier = (before or {}).get("xid_counts", {})
    return sorted(
        int(code)
        for code, count in card["xid_counts"].items()
        if int(code) in FATAL_XIDS and count > 0 and count != earlier.get(code, 0)
    )


def _passes(earlier: dict | None, fault_at: str | None, now) -> int:
    """A card's healthy samples in a row, this one counted: one more than the stored sample's,
    or the intervals since its last fault where more — a node sends no sample while its cards
    stay as they were, so each interval it was silent was a healthy one."""
    counted = (earlier or {}).get("passes", 0) + 1
    if fault_at is None:
        return counted
    elapsed = now - datetime.fromisoformat(fault_at)
    return max(counted, int(elapsed.total_seconds() // settings.TUNEPLANE_TELEMETRY_INTERVAL))


def judge(
    previous: list[dict],
    sample: dict,
    devices: list[dict],
    unhealthy: dict,
    now,
    returns_after: int | None = quarantine.HEALTH_RETURNS_AFTER,
):
    """The cards to store and the health changes a sample brings: a pure computation.

    A card is unhealthy on a new fatal XID, on uncorrectable ECC errors rising, on a fault
    its node saw itself (the driver cannot open it, H5) — in every sample that carries it —
    or when it is missing from a sample while the stored one had it. Each stored card counts its
    healthy samples in a row (``passes``: the intervals since its last fault where more, as a
    node's silence is its cards as they were; a fault or a return from missing sets it to 0).
    A quarantined card is healthy again (H6) after ``returns_after`` of them (its Fleet's
    health_returns_after) and no fault for TUNEPLANE_GPU_HEALTH_QUIET (a missing card's
    counted from its return); with ``returns_after`` None (its Fleet has a health check,
    H5) never by samples — only its check's passes return it. Returns (cards,
    became_unhealthy: {uuid: view}, became_healthy: {uuid: why})."""
    before = {card["uuid"]: card for card in previous}
    in_inventory = {device["uuid"] for device in devices}
    quiet = timedelta(seconds=settings.TUNEPLANE_GPU_HEALTH_QUIET)
    stamp = now.isoformat()
    cards, sick, well = [], {}, {}
    for card in sample["cards"]:
        earlier = before.get(card["uuid"])
        faults = [f"XID {code}" for code in _new_fatal_xids(card, earlier)]
        if card.get("fault"):  # what the node saw itself (H5): while it lasts, a fault
            faults.append(card["fault"])
        if earlier and card["ecc_uncorrected"] > earlier["ecc_uncorrected"]:
            faults.append(
                f"uncorrectable ECC errors {earlier['ecc_uncorrected']} → {card['ecc_uncorrected']}"
            )
        # A card back from missing was missing until this sample, as far as the console
        # knows: a node sends a sample when its card set changes, and none in between.
        back = bool(earlier and earlier.get("missing"))
        fault_at = stamp if faults or back else (earlier or {}).get("fault_at")
        passes = 0 if faults or back else _passes(earlier, fault_at, now)
        cards.append({**card, "fault_at": fault_at, "missing": False, "passes": passes})
        view = {"index": card["index"], "name": card["name"]}
        if faults and card["uuid"] not in unhealthy:
            sick[card["uuid"]] = {**view, "reason": "; ".join(faults), "since": stamp}
        elif (
            not faults
            and card["uuid"] in unhealthy
            and returns_after is not None
            and quarantine.returns(
                passes=passes,
                needed=returns_after,
                quiet_for=None if fault_at is None else now - datetime.fromisoformat(fault_at),
                quiet=quiet,
            )
        ):
            well[card["uuid"]] = (
                f"{passes} healthy samples in a row, no fault for {quiet.total_seconds():g} s"
            )
    present = {card["uuid"] for card in sample["cards"]}
    for uuid, earlier in before.items():
        if uuid in present:
            continue
        if uuid not in in_inventory:  # taken out of the machine: no longer the node's card
            if uuid in unhealthy:
                well[uuid] = "no longer in the node's inventory"
            continue
        cards.append({**earlier, "fault_at": stamp, "missing": True, "passes": 0})
        if uuid not in unhealthy:
            view = {"index": earlier["index"], "name": earlier["name"]}
            sick[uuid] = {**view, "reason": "missing from the sample", "since": stamp}
    return sorted(cards, key=lambda card: card["index"]), sick, well


UPSERT = """
INSERT INTO {table} (node_id, observed_at, cards_observed_at, source, host, cards)
SELECT node_id, observed_at, cards_observed_at, source, host, cards
FROM jsonb_to_recordset(%s::jsonb) AS sample(node_id varchar, observed_at timestamptz,
    cards_observed_at timestamptz, source varchar, host jsonb, cards jsonb)
ON CONFLICT (node_id) DO UPDATE SET observed_at = EXCLUDED.observed_at,
    cards_observed_at = EXCLUDED.cards_observed_at, source = EXCLUDED.source,
    host = EXCLUDED.host, cards = EXCLUDED.cards
"""
UPDATED = ["observed_at", "cards_observed_at", "source", "host", "cards"]


def _upsert(rows: list[NodeTelemetry]) -> None:
    """One statement for the batch. On PostgreSQL the rows go as one JSON document: Django's
    bulk upsert sends each JSON column as a text array, which psycopg quotes character by
    character in Python — most of a flush's time at a few hundred nodes (make bench)."""
    if connection.vendor != "postgresql":
        NodeTelemetry.objects.bulk_create(
            rows, update_conflicts=True, unique_fields=["node"], update_fields=UPDATED
        )
        return
    document = json.dumps(
        [
            {
                "node_id": row.node_id,
                "observed_at": row.observed_at.isoformat(),
                "cards_observed_at": row.cards_observed_at.isoformat()
                if row.cards_observed_at
                else None,
                "source": row.source,
                "host": row.host,
                "cards": row.cards,
            }
            for row in rows
        ]
    )
    with connection.cursor() as cursor:
        cursor.execute(UPSERT.format(table=NodeTelemetry._meta.db_table), [document])


def telemetry_store(*, samples: dict[str, tuple[float, dict]]) -> dict:
    """One gateway flush: each node's latest sample (received at a Unix time), checked and
    stored in one statement, the cards' health judged and changed where it moved, in one
    transaction. A node whose sample is refused is left as it was; the others are stored.
    Returns what it did: stored, refused (node ids), health changes, and the samples stored
    (checked) by node."""
    checked, refused = {}, []
    for node_id, (at, sample) in samples.items():
        try:
            checked[node_id] = (datetime.fromtimestamp(at, UTC), telemetry_checked(sample))
        except ValidationFailed as error:
            logger.warning("node %s: telemetry refused: %s", node_id, error.message)
            refused.append(node_id)
    rows = (
        Node.objects.filter(pk__in=list(checked))
        .exclude(scheduling_state=SchedulingState.REMOVED)
        .values_list(
            "id",
            "inventory",
            "unhealthy_cards",
            "telemetry__cards",
            "telemetry__cards_observed_at",
            "fleet_id",
            "fleet__config",
        )
    )
    stored, changes, faulted_fleets = [], [], set()
    for node_id, inventory, unhealthy, previous, cards_at, fleet_id, config in rows:
        at, sample = checked[node_id]
        if sample["source"]:
            cards, sick, well = judge(
                previous or [],
                sample,
                inventory.get("devices") or [],
                unhealthy,
                at,
                None if checks.HealthCheck.of(config) else quarantine.health_returns_after(config),
            )
            if sick or well:
                changes.append((node_id, sick, well, at))
            if sick:
                faulted_fleets.add(fleet_id)
            cards_at = at
        else:  # the probe failed this time: the cards stay as last read, judged as then
            cards = previous or []
        stored.append(
            NodeTelemetry(
                node_id=node_id,
                observed_at=at,
                cards_observed_at=cards_at,
                source=sample["source"],
                host=sample["host"],
                cards=cards,
            )
        )
    stored.sort(key=lambda row: row.node_id)  # one lock order for every flush
    with transaction.atomic():
        _upsert(stored)
        if faulted_fleets:  # H7: the breakers before any node, in one order (health.py)
            health_breakers_lock(faulted_fleets)
        for node_id, sick, well, at in sorted(changes, key=lambda change: change[0]):
            node_cards_health(node_id=node_id, unhealthy=sick, healthy=well, now=at)
    return {
        "stored": len(stored),
        "refused": refused,
        "health_changes": len(changes),
        "samples": {row.node_id: checked[row.node_id][1] for row in stored},
    }
