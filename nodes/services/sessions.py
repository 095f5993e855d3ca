"""Control sessions: opened at a node's Hello, closed when its stream ends — in batches.

A gateway replica answers every Hello waiting for the database with one call
(``sessions_open``), and closes every ended stream's session the same way
(``sessions_close``): after a restart, 10,000 nodes reconnect at once, and a session
opened one transaction at a time would keep them waiting for minutes (issue 20). A batch
keeps each Hello's guarantees: a credential that may not speak is refused, a removed node
is refused, one open session per node (a newer stream replaces the older), a successor
credential used on a stream retires its predecessors, each open and close audited, the
node's commands reconciled (L5). The statements per batch do not grow with its size.

Locks are taken in the one order every writer here keeps: the nodes, in id order, then
their sessions, then their commands.
"""

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from audit.services import Actor, audit_record_by_each
from fleets.choices import FleetDelivery
from fleets.models import Fleet
from tuneplane import bulk_insert
from tuneplane.errors import ApplicationError

from ..choices import SchedulingState
from ..models import ControlSession, Node, NodeCommand, NodeCredential
from . import commands
from .commands import Reported

logger = logging.getLogger("tuneplane.gateway")

SESSION = "nodes.controlsession"
REPLACED = "replaced by a newer stream"


class SessionRefused(ApplicationError):
    status = 403
    code = "session_refused"


@dataclass(frozen=True)
class Hello:
    """A node's Hello, as its verified certificate and its first message say."""

    node_id: str
    serial: str
    agent_version: str = ""
    reported: list[Reported] = field(default_factory=list)


@dataclass(frozen=True)
class Opened:
    session: ControlSession
    # Its pending commands, to deliver on the new stream (L5).
    pending: list[NodeCommand]
    # The digest of the inventory the console holds, when holding it is enough (the Welcome
    # says so, and the node need not send it); empty when the node must report it.
    inventory_digest: str = ""
    # Whether its Fleet watches the storage root (L6), and what the console last recorded.
    watch_storage: bool = False
    storage_root_visible: bool | None = None


# A node in one of these must report its inventory: the report is what makes it schedulable.
REPORT_REQUIRED = (SchedulingState.ENROLLED, SchedulingState.GONE)


def lease_until(now: datetime) -> datetime:
    return now + timedelta(seconds=settings.TUNEPLANE_LEASE_TTL)


def credential_refusal(
    credential: NodeCredential | None, node_id: str, serial: str, now: datetime
) -> str:
    """Why this certificate may not speak for its node; empty when it may."""
    if credential is None:
        return f"no credential {serial} for node {node_id}"
    if credential.revoked_at is not None:
        return f"credential {serial} is revoked"
    if credential.not_after <= now:
        return f"credential {serial} has expired"
    if credential.not_before > now:
        return f"credential {serial} is not valid yet"
    return ""


def _removed_refusal(node_id: str) -> str:
    """Why a removed node's agent is refused, for good (D4): said before its credential's
    revocation, so that the agent stops and says how to join again."""
    return (
        f"node {node_id} is removed: its credential is dead (rule D4); a machine joins "
        "again as a new node, with a new join token"
    )


def authenticated_node(node_id: str, serial: str, now: datetime) -> Node:
    """The node a presented certificate speaks for, locked; refused if it may not speak."""
    credential = NodeCredential.objects.filter(node_id=node_id, serial=serial).first()
    if refusal := credential_refusal(credential, node_id, serial, now):
        if Node.objects.filter(pk=node_id, scheduling_state=SchedulingState.REMOVED).exists():
            refusal = _removed_refusal(node_id)
        raise SessionRefused(refusal)
    node = Node.objects.select_for_update(no_key=True).get(pk=node_id)
    if node.scheduling_state == SchedulingState.REMOVED:
        raise SessionRefused(_removed_refusal(node_id))
    return node


def session_open(
    *, node_id: str, serial: str, gateway: str, agent_version: str = ""
) -> ControlSession:
    """Open a node's session; a newer stream replaces an older one (its session is closed)."""
    opened = sessions_open(
        hellos=[Hello(node_id, serial, agent_version)], gateway=gateway, reconcile=False
    )[node_id]
    if isinstance(opened, SessionRefused):
        raise opened
    return opened.session


def sessions_open(
    *, hellos: list[Hello], gateway: str, reconcile: bool = True
) -> dict[str, Opened | SessionRefused]:
    """Open a session for each Hello — one per node: the gateway never puts two of one node
    in a batch — in one transaction, and (``reconcile``) settle each node's commands against
    what its Hello reports. Each node's answer: its session, or why it was refused."""
    now = timezone.now()
    by_node = {hello.node_id: hello for hello in hellos}
    if len(by_node) != len(hellos):
        raise ValueError("one Hello per node in a batch")
    answers: dict[str, Opened | SessionRefused] = {}
    with transaction.atomic():
        credentials = NodeCredential.objects.filter(node_id__in=list(by_node)).filter(
            Q(revoked_at__isnull=True) | Q(serial__in=[hello.serial for hello in hellos])
        )
        held: dict[str, list[NodeCredential]] = {}
        for credential in credentials:
            held.setdefault(credential.node_id, []).append(credential)
        current = {}
        for hello in hellos:
            mine = next((c for c in held.get(hello.node_id, []) if c.serial == hello.serial), None)
            if refusal := credential_refusal(mine, hello.node_id, hello.serial, now):
                answers[hello.node_id] = SessionRefused(refusal)
            else:
                current[hello.node_id] = mine
        if answers:  # a removed node's revoked credential: it is told it was removed (D4)
            for node_id in Node.objects.filter(
                pk__in=list(answers), scheduling_state=SchedulingState.REMOVED
            ).values_list("pk", flat=True):
                answers[node_id] = SessionRefused(_removed_refusal(node_id))
        nodes = list(
            Node.objects.select_for_update(no_key=True).filter(pk__in=list(current)).order_by("pk")
        )
        for node in nodes:
            if node.scheduling_state == SchedulingState.REMOVED:
                answers[node.pk] = SessionRefused(_removed_refusal(node.pk))
        nodes = [node for node in nodes if node.pk not in answers]
        if not nodes:
            return answers
        # A successor used on a stream retires every credential issued before it: a copied
        # old certificate dies now, not at its expiry.
        retired: dict[str, list[str]] = {}
        for node in nodes:
            for credential in held[node.pk]:
                if credential.revoked_at is None and credential.pk < current[node.pk].pk:
                    retired.setdefault(node.pk, []).append(credential.serial)
        if retired:
            NodeCredential.objects.filter(
                serial__in=[serial for serials in retired.values() for serial in serials]
            ).update(revoked_at=now)
        older = list(
            ControlSession.objects.select_for_update().filter(
                node__in=nodes, closed_at__isnull=True
            )
        )
        events = _closed(older, REPLACED, now, nodes=False)
        replacing = {session.node_id for session in older}
        sessions = []
        for node in nodes:
            hello = by_node[node.pk]
            sessions.append(
                ControlSession(
                    node=node,
                    gateway=gateway,
                    agent_version=hello.agent_version[:64],
                    opened_at=now,
                    last_heartbeat_at=now,
                    lease_expires_at=lease_until(now),
                )
            )
            node.last_seen_at = now
            node.agent_version = hello.agent_version[:64]
            node.lease_expires_at = lease_until(now)
            if node.pk in replacing:
                node.last_session_closed_at, node.last_session_close_reason = now, REPLACED
        bulk_insert.insert(sessions)
        _nodes_opened(nodes, replacing, now)
        for session in sessions:
            node_id = session.node_id
            events.append(
                (
                    Actor.of_node(node_id),
                    "control_session.opened",
                    session.pk,
                    None,
                    {
                        "node": node_id,
                        "gateway": gateway,
                        "credential_serial": by_node[node_id].serial,
                        **(
                            {"credentials_revoked": sorted(retired[node_id])}
                            if node_id in retired
                            else {}
                        ),
                    },
                )
            )
        audit_record_by_each(target_type=SESSION, events=events)
        pending = (
            commands.nodes_commands_reconcile(
                reported={s.node_id: by_node[s.node_id].reported for s in sessions}
            )
            if reconcile
            else {}
        )
    shared = set(
        Fleet.objects.filter(
            pk__in={node.fleet_id for node in nodes}, delivery=FleetDelivery.SHARED_MOUNT
        ).values_list("pk", flat=True)
    )
    for session, node in zip(sessions, nodes, strict=True):
        answers[node.pk] = Opened(
            session,
            pending.get(node.pk, []),
            inventory_digest=""
            if node.scheduling_state in REPORT_REQUIRED
            else node.inventory_digest,
            watch_storage=node.fleet_id in shared,
            storage_root_visible=node.inventory.get("storage_root_visible"),
        )
    logger.info("%d nodes connected to %s", len(sessions), gateway)
    return answers


def _nodes_opened(nodes: list[Node], replacing: set[str], now: datetime) -> None:
    """The nodes' new leases and agent versions (and, where a stream was replaced, why their
    last session closed), in one statement: Django's bulk_update builds a CASE per field per
    node, which cost a second of Python for 500 Hellos."""
    if connection.vendor != "postgresql":
        Node.objects.bulk_update(
            nodes,
            [
                *("last_seen_at", "agent_version", "lease_expires_at"),
                *("last_session_closed_at", "last_session_close_reason"),
            ],
        )
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE nodes_node AS n SET last_seen_at = %s, lease_expires_at = %s, "
            "agent_version = v.version, last_session_closed_at = CASE WHEN v.replacing "
            "THEN %s ELSE n.last_session_closed_at END, last_session_close_reason = CASE "
            "WHEN v.replacing THEN %s ELSE n.last_session_close_reason END "
            "FROM unnest(%s::text[], %s::text[], %s::boolean[]) AS v(id, version, replacing) "
            "WHERE n.id = v.id",
            [
                now,
                lease_until(now),
                now,
                REPLACED,
                [node.pk for node in nodes],
                [node.agent_version for node in nodes],
                [node.pk in replacing for node in nodes],
            ],
        )


def _closed(
    sessions: list[ControlSession], reason: str, now: datetime, *, nodes: bool = True
) -> list:
    """Close ``sessions`` — open, locked, and their nodes locked before them — in one
    statement per table (``nodes``: False when the caller writes the nodes itself); their
    audit events, to record with the batch's."""
    if not sessions:
        return []
    reason = reason[:200]
    ControlSession.objects.filter(pk__in=[session.pk for session in sessions]).update(
        closed_at=now, close_reason=reason
    )
    if nodes:
        Node.objects.filter(pk__in=[session.node_id for session in sessions]).update(
            lease_expires_at=None,  # its only open one
            last_session_closed_at=now,
            last_session_close_reason=reason,
        )
    return [
        (
            Actor.system("gateway"),
            "control_session.closed",
            session.pk,
            {"open": True},
            {"open": False, "node": session.node_id, "reason": reason},
        )
        for session in sessions
    ]


def session_close(*, session_id, reason: str) -> None:
    """The stream ended. Not evidence that anything the node runs has stopped (L5)."""
    sessions_close(ended={str(session_id): reason})


def sessions_close(*, ended: dict[str, str]) -> int:
    """Close the sessions whose streams ended — ``{session id: why}`` — those still open,
    in one transaction; the nodes locked first, in id order, so a close racing a reconnect
    or a removal waits instead of deadlocking. How many were closed."""
    ended = {str(session_id): reason for session_id, reason in ended.items()}
    if not ended:
        return 0
    now = timezone.now()
    node_ids = sorted(
        set(ControlSession.objects.filter(pk__in=list(ended)).values_list("node_id", flat=True))
    )
    closed = 0
    with transaction.atomic():
        list(
            Node.objects.select_for_update(no_key=True)
            .filter(pk__in=node_ids)
            .order_by("pk")
            .values("pk")
        )
        sessions = list(
            ControlSession.objects.select_for_update().filter(
                pk__in=list(ended), closed_at__isnull=True
            )
        )
        by_reason: dict[str, list[ControlSession]] = {}
        for session in sessions:
            by_reason.setdefault(ended[str(session.pk)], []).append(session)
        events = []
        for reason, group in by_reason.items():
            events += _closed(group, reason, now)
            closed += len(group)
        if events:
            audit_record_by_each(target_type=SESSION, events=events)
    for session in sessions:
        logger.info("node %s disconnected: %s", session.node_id, ended[str(session.pk)])
    return closed


def sessions_close_matching(sessions, reason: str, now: datetime, batch: int = 500) -> int:
    """Close the open ones of the queryset ``sessions`` for one reason, a batch per
    transaction; the nodes locked first, in id order. How many were closed."""
    closed = 0
    while True:
        node_ids = sorted(
            set(sessions.filter(closed_at__isnull=True).values_list("node_id", flat=True)[:batch])
        )
        if not node_ids:
            return closed
        with transaction.atomic():
            list(
                Node.objects.select_for_update(no_key=True)
                .filter(pk__in=node_ids)
                .order_by("pk")
                .values("pk")
            )
            group = list(
                sessions.select_for_update().filter(closed_at__isnull=True, node_id__in=node_ids)
            )
            audit_record_by_each(target_type=SESSION, events=_closed(group, reason, now))
            closed += len(group)
