"""Services of the control stream: leases, inventory reports, credential rotation and the
gateway replicas' own records (sessions are opened and closed in sessions.py).

Every write validated, in one transaction, audited where it changes what an
operator sees — except heartbeats, which only renew a lease and are written in
one batch per gateway replica per flush interval (``leases_renew``), so the
statements per second do not grow with the number of nodes.
"""

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, F, Value, When
from django.utils import timezone

from audit.services import Actor, audit_record
from tuneplane.errors import ApplicationError

from .. import pki
from ..choices import NODE_LIFECYCLE, SchedulingState
from ..inventory import normalize_inventory
from ..models import ControlSession, GatewayReplica, Node, NodeCredential
from ..selectors import cards_summary, commands_active_on
from .cordons import node_observe_storage_root
from .hardware import card_names_remember
from .sessions import authenticated_node, lease_until, sessions_close_matching

logger = logging.getLogger("tuneplane.gateway")


def leases_renew(
    heartbeats: dict[str, datetime], inventory_fresh: set[str] = frozenset()
) -> set[str]:
    """Renew many leases at once: two statements, whatever the number of sessions.

    ``inventory_fresh`` names the sessions whose beat said the inventory is unchanged:
    their node's inventory counts as observed at that beat (L1). Returns the sessions
    renewed; one left out was closed meanwhile (its node was removed, or its stream
    replaced on another replica), and its stream must end.
    """
    if not heartbeats:
        return set()
    ids = list(heartbeats)
    seen = [heartbeats[i] for i in ids]
    leases = [lease_until(at) for at in seen]
    fresh = [i in inventory_fresh for i in ids]
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # The nodes first, in id order: the one lock order of every writer here (node,
            # then its sessions), so a flush racing a close, a reconnect or another flush
            # waits instead of deadlocking.
            cursor.execute(
                "SELECT n.id FROM nodes_node n JOIN nodes_controlsession s ON s.node_id = n.id "
                "WHERE s.id = ANY(%s::uuid[]) ORDER BY n.id FOR UPDATE OF n",
                [ids],
            )
            cursor.execute(
                "UPDATE nodes_controlsession AS s SET last_heartbeat_at = v.seen, "
                "lease_expires_at = v.lease FROM unnest(%s::uuid[], %s::timestamptz[], "
                "%s::timestamptz[]) AS v(id, seen, lease) "
                "WHERE s.id = v.id AND s.closed_at IS NULL RETURNING s.id",
                [ids, seen, leases],
            )
            renewed = {str(row[0]) for row in cursor.fetchall()}
            cursor.execute(
                "UPDATE nodes_node AS n SET last_seen_at = v.seen, lease_expires_at = v.lease, "
                "inventory_observed_at = CASE WHEN v.fresh THEN v.seen "
                "ELSE n.inventory_observed_at END FROM unnest(%s::uuid[], %s::timestamptz[], "
                "%s::timestamptz[], %s::boolean[]) AS v(id, seen, lease, fresh), "
                "nodes_controlsession AS s WHERE s.id = v.id AND n.id = s.node_id "
                "AND s.closed_at IS NULL",
                [ids, seen, leases, fresh],
            )
            return renewed
        # Elsewhere (SQLite, the embedded default): the same, as set-based bulk updates.
        sessions = list(
            ControlSession.objects.filter(pk__in=ids, closed_at__isnull=True).only("id", "node_id")
        )
        for session in sessions:
            session.last_heartbeat_at = heartbeats[str(session.id)]
            session.lease_expires_at = lease_until(session.last_heartbeat_at)
        ControlSession.objects.bulk_update(sessions, ["last_heartbeat_at", "lease_expires_at"])
        nodes = list(
            Node.objects.filter(pk__in=[s.node_id for s in sessions]).only(
                "id", "inventory_observed_at"
            )
        )
        beats = {s.node_id: s for s in sessions}
        for node in nodes:
            session = beats[node.id]
            node.last_seen_at = session.last_heartbeat_at
            node.lease_expires_at = session.lease_expires_at
            if str(session.id) in inventory_fresh:
                node.inventory_observed_at = session.last_heartbeat_at
        Node.objects.bulk_update(
            nodes, ["last_seen_at", "lease_expires_at", "inventory_observed_at"]
        )
        return {str(session.id) for session in sessions}


class RotationTooSoon(ApplicationError):
    status = 429
    code = "rotation_too_soon"


ROTATION_INTERVAL = 60  # an agent rotates at two thirds of a lifetime: more often is not it


def credential_rotate(*, node_id: str, serial: str, csr: str) -> pki.IssuedCertificate:
    """J6: a node, authenticated by its current certificate, gets a new one for a new key.

    The current certificate stays valid until the new one is used on a stream (then it is
    revoked, in ``session_open``), so a node that crashes before it has written the new
    files keeps its identity. At most one rotation a minute (a quarter of a shorter lifetime).
    """
    parsed = pki.parse_csr(csr)
    now = timezone.now()
    interval = min(ROTATION_INTERVAL, settings.TUNEPLANE_NODE_CREDENTIAL_TTL / 4)
    with transaction.atomic():
        node = authenticated_node(node_id, serial, now)
        credentials = NodeCredential.objects.filter(node=node)  # the join's is no rotation
        recent = credentials.filter(created_at__gt=now - timedelta(seconds=interval))
        if recent.exclude(pk=credentials.order_by("pk").values("pk")[:1]).exists():
            raise RotationTooSoon(f"node {node_id} rotated less than {interval:g} s ago.")
        issued = pki.sign_node_csr(
            parsed, node.id, timedelta(seconds=settings.TUNEPLANE_NODE_CREDENTIAL_TTL)
        )
        NodeCredential.objects.create(
            node=node,
            serial=issued.serial,
            fingerprint_sha256=issued.fingerprint_sha256,
            not_before=issued.not_before,
            not_after=issued.not_after,
        )
        audit_record(
            actor=Actor.of_node(node_id),
            action="node.credential_rotated",
            target=node,
            before={"credential_serial": serial},
            after={"credential_serial": issued.serial, "expires_at": issued.not_after.isoformat()},
        )
    logger.info("node %s rotated its credential to %s", node_id, issued.serial)
    return issued


def node_report_inventory(*, node_id: str, inventory, digest: str = "") -> Node:
    """A report over the stream: stored with its observation time (J4's mapping applies),
    and with ``digest``, the report's own as the node computes it, so that a reconnecting
    node whose report has not changed need not send it again (Welcome.inventory_digest).

    Enrollment alone does not make a node ready: the first report on a live
    session makes an enrolled node schedulable.
    """
    inventory = normalize_inventory(inventory)
    now = timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update(no_key=True).get(pk=node_id)
        before = {"inventory": node.inventory, "scheduling_state": node.scheduling_state}
        node.inventory = inventory
        node.inventory_digest = digest[:64]
        node.inventory_observed_at = now
        card_names_remember((c["name"] for c in inventory["cards"]), now, node_id=node_id)
        for name, value in cards_summary(inventory, unhealthy=node.unhealthy_cards).items():
            setattr(node, name, value)
        live = node.lease_expires_at is not None and node.lease_expires_at > now
        # Enrolled, or back from gone: schedulable only through a live lease and this fresh
        # inventory (L1); a cordon, a separate record, is not touched. A machine that went
        # silent while draining is still leaving when it answers again (D1).
        if node.scheduling_state in (SchedulingState.ENROLLED, SchedulingState.GONE) and live:
            back = SchedulingState.SCHEDULABLE
            if node.drain_started_at is not None:
                draining = commands_active_on(node)
                back = SchedulingState.DRAINING if draining else SchedulingState.DRAINED
            NODE_LIFECYCLE.check(node.scheduling_state, back, target=node.pk)
            node.scheduling_state = back
        node.save(
            update_fields=[
                "inventory",
                "inventory_digest",
                "inventory_observed_at",
                "scheduling_state",
                "series_cards",
                "card_count",
            ]
        )
        after = {"inventory": node.inventory, "scheduling_state": node.scheduling_state}
        if after != before:
            audit_record(
                actor=Actor.of_node(node_id),
                action="node.inventory_reported",
                target=node,
                before=before,
                after=after,
            )
        node_observe_storage_root(node_id=node_id, visible=inventory["storage_root_visible"])
    return node


def gateway_started(*, name: str) -> GatewayReplica:
    """A gateway replica starts listening: audited, as what follows it in the log (sessions
    reopening) reads against it. The sessions its previous process left open, if it was
    killed, are closed a lease later (sessions_left_open_close)."""
    now = timezone.now()
    with transaction.atomic():
        earlier = GatewayReplica.objects.select_for_update().filter(name=name).first()
        replica, _ = GatewayReplica.objects.update_or_create(
            name=name, defaults={"started_at": now, "seen_at": now}
        )
        audit_record(
            actor=Actor.system("gateway"),
            action="gateway.started",
            target=replica,
            before={
                "started_at": earlier.started_at.isoformat(),
                "seen_at": earlier.seen_at.isoformat(),
            }
            if earlier
            else None,
            after={"name": name, "started_at": now.isoformat()},
        )
    return replica


def sessions_left_open_close(*, gateway: str, serving_since: datetime) -> int:
    """Close the sessions the killed process of replica ``gateway`` left open: those opened
    before ``serving_since``, when this process began (no process holds their streams).
    Called a lease after the start: by then their leases have run out, so every reader
    already counts them dead (a live session is an open one with a live lease), and a node
    that reconnected has replaced its own in the batch that opened the new one. So a
    restart under 10,000 nodes does not spend its first seconds closing 10,000 sessions
    while they reconnect (issue 20)."""
    now = timezone.now()
    closed = sessions_close_matching(
        ControlSession.objects.filter(gateway=gateway, opened_at__lt=serving_since),
        "gateway replica restarted",
        now,
    )
    if closed:
        logger.info(
            "gateway %s: closed %d sessions its previous process left open", gateway, closed
        )
    return closed


def sessions_of_silent_replicas_close(
    *, listening_since: datetime | None, now: datetime | None = None
) -> int:
    """Close the sessions of gateway replicas silent for replica_gone_after(), whose lease
    has run out: a replica that was killed and not started again closed none of its
    sessions. Bookkeeping only (liveness reads the leases, long expired by then), so judged
    late and carefully: never while the console has listened for less than that long
    (``listening_since``, the liveness sweep's Hearing; after a database outage every
    replica is silent until it announces again), and never on a short silence, which may be
    a replica backed up in a reconnect storm."""
    now = now or timezone.now()
    gone_after = replica_gone_after()
    if listening_since is None or listening_since > now - gone_after:
        return 0
    silent = GatewayReplica.objects.filter(seen_at__lt=now - gone_after).values("name")
    return sessions_close_matching(
        ControlSession.objects.filter(gateway__in=silent, lease_expires_at__lt=now),
        "gateway replica silent",
        now,
    )


def replica_gone_after() -> timedelta:
    """How long a gateway replica must be silent before its sessions are closed for it."""
    return max(5 * timedelta(seconds=settings.TUNEPLANE_LEASE_TTL), timedelta(minutes=2))


def gateway_alive(*, name: str, started_at: datetime) -> None:
    """Still listening: an observation, every few seconds, not audited (like a lease). A
    replica that could not say so for a lease (the database was away) heard nothing
    meanwhile: its listening starts again now, so the grace rule applies as after a restart."""
    now = timezone.now()
    gap = now - timedelta(seconds=settings.TUNEPLANE_LEASE_TTL)
    updated = GatewayReplica.objects.filter(name=name).update(
        seen_at=now,
        started_at=Case(When(seen_at__lt=gap, then=Value(now)), default=F("started_at")),
    )
    if not updated:  # its row was removed meanwhile
        GatewayReplica.objects.create(name=name, started_at=now, seen_at=now)
