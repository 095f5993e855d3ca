"""The liveness sweep (L2–L4): set-based, guarded, idempotent, audited once per transition.

Each transition locks the rows its guard matches, changes them and inserts their
audit events — on PostgreSQL in one statement, elsewhere in three — so a sweep's
statements do not grow with the number of nodes, and two sweeps that overlap (two
beats by mistake, a retried task) make each transition once: the second one's
guard no longer matches the rows the first changed.
"""

import json
import logging
from datetime import datetime

from django.core.exceptions import EmptyResultSet
from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from audit.services import Actor, audit_record_many
from fleets.models import Fleet
from tuneplane import correlation

from .choices import SchedulingState
from .models import Node, quiet_threshold

logger = logging.getLogger("tuneplane.liveness")

# The capabilities with a liveness rule of their own; eval work is batch work, like train's.
LIVENESS_CAPABILITIES = ("train", "serve", "env")
THRESHOLD_OF = {"train": "train", "eval": "train", "serve": "serve", "env": "env"}
# What "gone" may replace: a drained machine that goes quiet is simply switched off.
GONE_FROM = (SchedulingState.ENROLLED, SchedulingState.SCHEDULABLE, SchedulingState.DRAINING)
ACTOR = Actor.system("liveness")


def gone_threshold(capabilities) -> str:
    """L4: gone on the most generous of the Fleet's capabilities' thresholds."""
    names = {THRESHOLD_OF[c] for c in capabilities if c in THRESHOLD_OF} or {"train"}
    return max(names, key=quiet_threshold)


def _transition(guarded: QuerySet, change: dict, action: str, after: dict) -> int:
    if connection.vendor == "postgresql":
        return _transition_in_one_statement(guarded, change, action, after)
    rows = list(guarded.select_for_update().values_list("id", "scheduling_state"))
    if not rows:
        return 0
    ids = [node_id for node_id, _ in rows]
    guarded.filter(pk__in=ids).update(**change)
    audit_record_many(actor=ACTOR, action=action, target_type="nodes.node", changes=[
        (node_id, {"scheduling_state": state} if "scheduling_state" in change else None, after)
        for node_id, state in rows])
    return len(rows)


def _transition_in_one_statement(guarded: QuerySet, change: dict, action: str,
                                 after: dict) -> int:
    """Lock what the guard matches, change it, and audit it, in one statement: the rows
    never travel to Python. FOR UPDATE re-checks the guard on a row another sweep changed
    meanwhile, which is what makes each transition happen once."""
    try:
        select, select_params = (guarded.order_by().values_list("id", "scheduling_state")
                                 .query.sql_with_params())
    except EmptyResultSet:  # e.g. no Fleet declares the capability
        return 0
    (column, value), = change.items()
    before = ("jsonb_build_object('scheduling_state', old.scheduling_state)"
              if column == "scheduling_state" else "NULL")
    # "id = ANY(ARRAY(...))" makes the UPDATE look rows up by primary key; a join with the
    # CTE would hash the whole table.
    sql = (f"WITH old AS ({select} FOR UPDATE), "
           f"changed AS (UPDATE nodes_node SET {column} = %s "
           "WHERE id = ANY(ARRAY(SELECT id FROM old)) RETURNING id) "
           "INSERT INTO audit_auditevent (at, actor_type, actor_id, actor_label, action, "
           "target_type, target_id, before, after, forced, correlation_id) "
           f"SELECT %s, %s, %s, %s, %s, 'nodes.node', old.id, {before}, %s::jsonb, false, %s "
           "FROM changed JOIN old ON old.id = changed.id")
    with connection.cursor() as cursor:
        cursor.execute(sql, [*select_params, value, timezone.now(), ACTOR.type, ACTOR.id,
                             ACTOR.label, action, json.dumps(after), correlation.current()])
        return cursor.rowcount


def liveness_sweep(*, now: datetime | None = None) -> dict[str, int]:
    """Mark what went quiet or gone since the last sweep, and what answers again."""
    now = now or timezone.now()
    capabilities_of = dict(Fleet.objects.values_list("id", "capabilities"))
    changed: dict[str, int] = {}
    live = Node.objects.exclude(scheduling_state=SchedulingState.REMOVED)
    with transaction.atomic():
        for capability in LIVENESS_CAPABILITIES:
            flag = f"quiet_{capability}"
            cutoff = now - quiet_threshold(capability)
            declaring = [fleet for fleet, caps in capabilities_of.items() if capability in caps]
            changed[f"{capability}_quiet"] = _transition(
                live.filter(fleet_id__in=declaring, last_seen_at__lt=cutoff, **{flag: False}),
                {flag: True}, "node.quiet", {"capability": capability, "liveness": "quiet"})
            changed[f"{capability}_ok"] = _transition(
                live.filter(last_seen_at__gte=cutoff, **{flag: True}),
                {flag: False}, "node.answering", {"capability": capability, "liveness": "ok"})
        by_threshold: dict[str, list[str]] = {}
        for fleet, caps in capabilities_of.items():
            by_threshold.setdefault(gone_threshold(caps), []).append(fleet)
        changed["gone"] = sum(
            _transition(live.filter(fleet_id__in=fleets, scheduling_state__in=GONE_FROM,
                                    last_seen_at__lt=now - quiet_threshold(threshold)),
                        {"scheduling_state": SchedulingState.GONE}, "node.gone",
                        {"scheduling_state": SchedulingState.GONE, "threshold": threshold})
            for threshold, fleets in by_threshold.items())
    if any(changed.values()):
        logger.info("liveness sweep: %s", ", ".join(f"{k} {v}" for k, v in changed.items() if v))
    return changed
