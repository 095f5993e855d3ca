"""The liveness sweep (L2–L4): set-based, guarded, idempotent, audited once per transition.

On PostgreSQL the whole sweep is one statement (``SWEEP_SQL``); elsewhere each kind
of transition is three. Either way a sweep's statements do not grow with the number
of nodes, every transition writes its audit event in the same transaction, and two
sweeps that overlap (two beats by mistake, a retried task) make each transition
once: rows are locked before they are judged final, and a row another sweep changed
no longer matches.
"""

import json
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, Min, QuerySet
from django.utils import timezone

from audit.services import Actor, audit_record_each, audit_record_many
from fleets.choices import FleetCapability
from fleets.models import Fleet

from ..choices import LIVENESS_CAPABILITIES, SchedulingState
from ..metrics import SWEEP_DURATION, SWEEP_TRANSITIONS
from ..models import GatewayReplica, Node, quiet_threshold
from .control import sessions_of_silent_replicas_close

logger = logging.getLogger("tuneplane.liveness")

# Eval work is batch work: it goes quiet on train's threshold.
THRESHOLD_OF = {
    FleetCapability.TRAIN: "train",
    FleetCapability.EVAL: "train",
    FleetCapability.SERVE: "serve",
    FleetCapability.ENV: "env",
}
# What "gone" may replace: a drained machine that goes quiet is simply switched off.
GONE_FROM = (SchedulingState.ENROLLED, SchedulingState.SCHEDULABLE, SchedulingState.DRAINING)
ACTOR = Actor.system("liveness")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def gone_threshold(capabilities) -> str:
    """L4: gone on the most generous of the Fleet's capabilities' thresholds."""
    names = {THRESHOLD_OF[c] for c in capabilities if c in THRESHOLD_OF} or {"train"}
    return max(names, key=quiet_threshold)


def _transition(
    guarded: QuerySet, change: dict, action: str, before: dict | None, after: dict
) -> int:
    """Lock what the guard matches, change it, audit it: three statements, any row count.
    ``before`` is what every matched row was; None: its scheduling state, row by row."""
    rows = list(guarded.select_for_update().values_list("id", "scheduling_state"))
    if not rows:
        return 0
    ids = [node_id for node_id, _ in rows]
    guarded.filter(pk__in=ids).update(**change)
    audit_record_many(
        actor=ACTOR,
        action=action,
        target_type="nodes.node",
        changes=[
            (node_id, before or {"scheduling_state": state}, after) for node_id, state in rows
        ],
    )
    return len(rows)


def _sweep_with_the_orm(hearing: "Hearing", capabilities_of: dict) -> dict[str, int]:
    """The sweep where PostgreSQL is not (SQLite, the embedded default)."""
    changed: dict[str, int] = {}
    live = Node.objects.exclude(scheduling_state=SchedulingState.REMOVED)
    for capability in LIVENESS_CAPABILITIES:
        flag = f"quiet_{capability}"
        cutoff = hearing.until - quiet_threshold(capability)
        declaring = [fleet for fleet, caps in capabilities_of.items() if capability in caps]
        changed[f"{capability}_quiet"] = _transition(
            live.filter(
                fleet_id__in=declaring if hearing.judges(capability) else [],
                last_seen_at__lt=cutoff,
                **{flag: False},
            ),
            {flag: True},
            "node.quiet",
            {"capability": capability, "liveness": "ok"},
            {"capability": capability, "liveness": "quiet"},
        )
        changed[f"{capability}_ok"] = _transition(
            live.filter(**{flag: True}).exclude(fleet_id__in=declaring, last_seen_at__lt=cutoff),
            {flag: False},
            "node.answering",
            {"capability": capability, "liveness": "quiet"},
            {"capability": capability, "liveness": "ok"},
        )
    by_threshold: dict[str, list[str]] = {}
    for fleet, caps in capabilities_of.items():
        by_threshold.setdefault(gone_threshold(caps), []).append(fleet)
    changed["gone"] = sum(
        _transition(
            live.filter(
                fleet_id__in=fleets,
                scheduling_state__in=GONE_FROM,
                last_seen_at__lt=hearing.until - quiet_threshold(threshold),
            ),
            {"scheduling_state": SchedulingState.GONE},
            "node.gone",
            None,
            {"scheduling_state": SchedulingState.GONE, "threshold": threshold},
        )
        for threshold, fleets in by_threshold.items()
        if hearing.judges(threshold)
    )
    return changed


# Every transition of a sweep in one statement: judge the rows that may change (an index
# range on last_seen_at, plus the few already quiet), lock those whose verdict changes —
# FOR UPDATE re-judges a row another sweep changed meanwhile, so each transition happens
# once — update them by primary key, and return one audit event per transition, written by
# the audit service in the same transaction (one INSERT per 5,000 events). Rows are locked
# in id order, the order every gateway write takes its nodes in, and only where a verdict
# changes: in a restart's first minutes, while silence is not yet evidence, a sweep that
# locked every silent node each second in the plan's order held up the gateway's batches of
# the nodes coming back, and deadlocked them in every 10,000-node restart (issue 20).
_VERDICTS = {
    "train": """(n.fleet_id = ANY(%(f_train)s) AND n.last_seen_at < %(t_train)s
     AND (%(j_train)s OR n.quiet_train))""",
    "serve": """(n.fleet_id = ANY(%(f_serve)s) AND n.last_seen_at < %(t_serve)s
     AND (%(j_serve)s OR n.quiet_serve))""",
    "env": """(n.fleet_id = ANY(%(f_env)s) AND n.last_seen_at < %(t_env)s
     AND (%(j_env)s OR n.quiet_env))""",
    "gone": "(n.scheduling_state = ANY(%(gone_from)s) AND n.last_seen_at < r.gone_cut)",
}
_JUDGE = ",\n    ".join(f"{verdict} AS {name}" for name, verdict in _VERDICTS.items())
_CHANGES = " OR ".join(
    [f"{_VERDICTS[cap]} <> n.quiet_{cap}" for cap in ("train", "serve", "env")]
    + [_VERDICTS["gone"]]
)
_EVENT = """(CASE WHEN c.{cap} THEN 'node.quiet' ELSE 'node.answering' END,
     jsonb_build_object('capability', '{cap}', 'liveness',
                        CASE WHEN c.{cap} THEN 'ok' ELSE 'quiet' END),
     jsonb_build_object('capability', '{cap}', 'liveness',
                        CASE WHEN c.{cap} THEN 'quiet' ELSE 'ok' END), c.{cap} <> c.was_{cap})"""
SWEEP_SQL = f"""
WITH rule AS (
  SELECT * FROM unnest(%(fleets)s::varchar[], %(gone_cut)s::timestamptz[], %(gone_by)s::text[])
    AS r(fleet_id, gone_cut, gone_by)
), judged AS (
  SELECT n.id, r.gone_by, n.scheduling_state AS was_state, n.quiet_train AS was_train,
         n.quiet_serve AS was_serve, n.quiet_env AS was_env, {_JUDGE}
  FROM nodes_node n JOIN rule r ON r.fleet_id = n.fleet_id
  WHERE n.scheduling_state <> 'removed'
    AND (n.last_seen_at < %(recent_cut)s OR n.quiet_train OR n.quiet_serve OR n.quiet_env)
    AND ({_CHANGES})
  ORDER BY n.id
  FOR UPDATE OF n
), changing AS (
  SELECT * FROM judged
  WHERE train <> was_train OR serve <> was_serve OR env <> was_env OR gone
), changed AS (
  UPDATE nodes_node n SET quiet_train = j.train, quiet_serve = j.serve, quiet_env = j.env,
         scheduling_state = CASE WHEN j.gone THEN 'gone' ELSE n.scheduling_state END
  FROM (SELECT n.id, {_JUDGE} FROM nodes_node n JOIN rule r ON r.fleet_id = n.fleet_id
        WHERE n.id = ANY(ARRAY(SELECT id FROM changing))) AS j
  WHERE n.id = j.id
  RETURNING n.id
), written AS (
  SELECT c.id, t.action, t.before, t.after
  FROM changing c JOIN changed USING (id) CROSS JOIN LATERAL (VALUES
    {_EVENT.format(cap="train")},
    {_EVENT.format(cap="serve")},
    {_EVENT.format(cap="env")},
    ('node.gone', jsonb_build_object('scheduling_state', c.was_state),
     jsonb_build_object('scheduling_state', 'gone', 'threshold', c.gone_by), c.gone)
  ) AS t(action, before, after, happened)
  WHERE t.happened
)
SELECT id, action, before::text, after::text FROM written
"""
_KEY = {"node.quiet": "{}_quiet", "node.answering": "{}_ok", "node.gone": "gone"}


def _sweep_in_one_statement(hearing: "Hearing", capabilities_of: dict) -> dict[str, int]:
    fleets = list(capabilities_of)
    gone_by = [gone_threshold(capabilities_of[fleet]) for fleet in fleets]
    thresholds = {capability: quiet_threshold(capability) for capability in LIVENESS_CAPABILITIES}
    params = {
        "fleets": fleets,
        "gone_by": gone_by,
        # A Fleet whose gone threshold the console has not listened for: no one is older.
        "gone_cut": [
            hearing.until - quiet_threshold(name) if hearing.judges(name) else EPOCH
            for name in gone_by
        ],
        "recent_cut": hearing.until - min(thresholds.values()),
        "gone_from": list(GONE_FROM),
    }
    for capability, threshold in thresholds.items():
        params[f"f_{capability}"] = [f for f in fleets if capability in capabilities_of[f]]
        params[f"t_{capability}"] = hearing.until - threshold
        params[f"j_{capability}"] = hearing.judges(capability)
    changed = {
        key: 0
        for capability in LIVENESS_CAPABILITIES
        for key in (f"{capability}_quiet", f"{capability}_ok")
    } | {"gone": 0}
    with connection.cursor() as cursor:
        cursor.execute(SWEEP_SQL, params)
        events = [
            (action, node_id, json.loads(before), json.loads(after))
            for node_id, action, before, after in cursor.fetchall()
        ]
    audit_record_each(actor=ACTOR, target_type="nodes.node", events=events)
    for action, _, _, after in events:
        changed[_KEY[action].format(after.get("capability"))] += 1
    return changed


@dataclass(frozen=True)
class Hearing:
    """What the console heard: gateway replicas listening since ``since`` (None: none is
    listening) up to ``until``. Silence is evidence only while the console listened: up to
    ``until``, and only once it has listened for a whole lease and for the threshold judged
    — long enough for every node that is up to have reconnected and spoken. So a console
    outage, a gateway restart included, is never mistaken for a fleet outage (the
    console-outage grace rule; the failure of Nomad issue #3035 is the opposite)."""

    since: datetime | None
    until: datetime

    def judges(self, threshold: str) -> bool:
        lease = timedelta(seconds=settings.TUNEPLANE_LEASE_TTL)
        return self.since is not None and self.until - self.since >= max(
            lease, quiet_threshold(threshold)
        )


def console_hearing(now: datetime) -> Hearing:
    """Replicas that announced themselves within a lease are listening; the earliest start
    among them is when the console's present listening began."""
    lease = timedelta(seconds=settings.TUNEPLANE_LEASE_TTL)
    heard = GatewayReplica.objects.filter(seen_at__gte=now - lease).aggregate(
        since=Min("started_at"), until=Max("seen_at")
    )
    if heard["since"] is None:
        return Hearing(None, now)
    return Hearing(heard["since"], min(now, heard["until"]))


def liveness_sweep(*, now: datetime | None = None) -> dict[str, int]:
    """Mark what went quiet or gone since the last sweep, and what answers again, on the
    silence the console heard (Hearing)."""
    started = time.perf_counter()
    now = now or timezone.now()
    capabilities_of = dict(Fleet.objects.values_list("id", "capabilities"))
    hearing = console_hearing(now)
    sessions_of_silent_replicas_close(listening_since=hearing.since, now=now)
    with transaction.atomic():
        if connection.vendor == "postgresql":
            changed = _sweep_in_one_statement(hearing, capabilities_of)
        else:
            changed = _sweep_with_the_orm(hearing, capabilities_of)
    if hearing.since is None:
        logger.info("liveness sweep: no gateway replica is listening; silence is not judged")
    if any(changed.values()):
        logger.info("liveness sweep: %s", ", ".join(f"{k} {v}" for k, v in changed.items() if v))
    SWEEP_DURATION.observe(time.perf_counter() - started)
    for change, count in changed.items():
        SWEEP_TRANSITIONS.labels(change).inc(count)
    return changed
