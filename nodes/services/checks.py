"""A Fleet's health checks run by its nodes (DESIGN §9, H5): sent, timed out, and their results
written on the cards — each in the transaction of the report or the sweep that moves it.

``health_checks_run`` (beat, every TUNEPLANE_SWEEP_INTERVAL) takes each node Fleet with a
``health_check`` in turn, its row locked against the allocator's pass (so a check is never
sent on a card a pass is placing on), then its health breaker, then its nodes — the order
every telemetry flush takes breakers and nodes in (a check's result takes the breaker before
the node too): a check past its timeout is stopped and failed, and a
check is sent on each idle card of each connected node that owes one (nodes.checks.due) — a
``start`` command on that card alone, confined by the agent like any member.

``check_command_changed`` (an observer of every command's change) follows a check's start: its
end is the result (exit 0 passes), a failure quarantines the card as its Fleet's breaker admits
(H6, H7), passes in a row return a quarantined card (``health_returns_after``), and its cleanup
is sent; once the node confirms it, the result is the card's state. A member's cleanup owes
each of its cards a check before the next member.

What is audited: the commands (node_command.*), and each card whose checked state changes
(node.card_check: passed, failed) with the check's exit code and output. A check that starts,
and one that passes again on a card that had passed, are observations, kept on the card and
not audited (as telemetry samples are not).
"""

import logging

from celery import current_app
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.services import Actor, audit_record
from fleets.choices import FleetKind
from fleets.models import Fleet

from .. import checks, quarantine
from ..choices import ACTIVE_COMMAND_STATES, LEAVING, CommandKind, CommandState
from ..models import Node, NodeCommand
from .commands import ENDED, node_commands_create_many
from .cordons import node_locked
from .health import health_breakers_lock, node_cards_health

logger = logging.getLogger("tuneplane.nodes")

HEALTH_CHECK = Actor.system("health-check")
# placement's pass (placement.services.passes.ALLOCATE_TASK), asked by name: nodes never
# imports placement.
ALLOCATE_TASK = "placement.allocate"
# Between a timed-out check's SIGTERM and its SIGKILL.
CHECK_GRACE = 5.0


def health_checks_run(now=None) -> dict:
    """H5's sweep over every node Fleet with a health check, one transaction a Fleet. Returns
    how many checks it sent and how many it stopped for their timeout."""
    now = now or timezone.now()
    done = {"sent": 0, "timed_out": 0}
    fleet_ids = Fleet.objects.filter(kind=FleetKind.NODE, config__has_key="health_check")
    for fleet_id in fleet_ids.order_by("id").values_list("id", flat=True):
        with transaction.atomic():
            # FOR NO KEY UPDATE: it waits for the allocator's pass (FOR UPDATE) and another
            # sweep, never for a row whose key share on the Fleet (a breaker made) it holds.
            fleet = Fleet.objects.select_for_update(no_key=True).filter(pk=fleet_id).first()
            check = checks.HealthCheck.of(fleet.config) if fleet is not None else None
            if check is None:
                continue
            sent, timed_out = _fleet_checks(fleet, check, now)
        done["sent"] += sent
        done["timed_out"] += timed_out
    return done


def _fleet_checks(fleet: Fleet, check: checks.HealthCheck, now) -> tuple[int, int]:
    health_breakers_lock([fleet.id])  # a timeout may quarantine: the breaker before any node
    nodes = list(
        Node.objects.select_for_update(no_key=True)
        .filter(fleet=fleet, lease_expires_at__gt=now)
        .exclude(scheduling_state__in=LEAVING)
        .order_by("id")
    )
    held: dict[str, set[str]] = {}
    for node_id, payload in NodeCommand.objects.filter(
        Q(state__in=ACTIVE_COMMAND_STATES) | Q(cleaned_at__isnull=True),
        node__in=nodes,
        kind=CommandKind.START,
    ).values_list("node_id", "payload"):
        held.setdefault(node_id, set()).update(
            card.get("uuid") for card in payload.get("cards") or []
        )
    starts, stops, timed_out = [], [], 0
    owed: list[tuple[Node, dict]] = []  # (node, {uuid: device}) whose checks are sent now
    for node in nodes:
        devices = {d["uuid"] for d in node.inventory.get("devices") or [] if d.get("uuid")}
        # A card taken out of the machine leaves its record, once no check of it runs.
        records = {
            uuid: record
            for uuid, record in node.card_checks.items()
            if uuid in devices or record.get("state") == checks.CHECKING
        }
        changed = records != node.card_checks
        for uuid, record in list(records.items()):
            if checks.timed_out(record, now, check.timeout):
                seconds = check.timeout.total_seconds()
                ended = checks.finished(
                    {**record, "timed_out": True},
                    passed=False,
                    exit_code=None,
                    output=f"no result {seconds:g} s after it started",
                    now=now,
                )
                records[uuid], changed = ended, True
                stops.append(
                    (
                        node.id,
                        CommandKind.STOP,
                        {"member": record["command"], "grace_seconds": CHECK_GRACE},
                    )
                )
                timed_out += 1
                _failed(node, uuid, ended, now)
        due = {
            device["uuid"]: device
            for device in node.inventory.get("devices") or []
            if device.get("uuid")
            and device["uuid"] not in held.get(node.id, ())
            and checks.due(records.get(device["uuid"]), now, check.interval)
        }
        if due:
            owed.append((node, due))
            starts.extend(
                (node.id, CommandKind.START, check.payload(device, CHECK_GRACE))
                for device in due.values()
            )
        if changed:
            Node.objects.filter(pk=node.pk).update(card_checks=records)
    created = node_commands_create_many(actor=HEALTH_CHECK, commands=[*stops, *starts])
    by_card = {
        (command.node_id, command.payload["labels"][checks.LABEL]): command
        for command in created
        if command.kind == CommandKind.START
    }
    for node, due in owed:
        records = dict(Node.objects.values_list("card_checks", flat=True).get(pk=node.pk))
        for uuid, device in due.items():
            records[uuid] = checks.started(
                records.get(uuid),
                index=device["index"],
                command=by_card[(node.id, uuid)].pk,
                now=now,
            )
        Node.objects.filter(pk=node.pk).update(card_checks=records)
    if starts or stops:
        logger.info(
            "fleet %s: %d health checks sent, %d stopped for their timeout",
            fleet.id,
            len(starts),
            timed_out,
        )
    return len(starts), timed_out


def _failed(node: Node, uuid: str, record: dict, now) -> None:
    """A check failed: audited, and the card quarantined as the Fleet's breaker admits (H6,
    H7) — a card the breaker leaves in service keeps working, its failure shown."""
    device = next((d for d in node.inventory.get("devices") or [] if d.get("uuid") == uuid), {})
    reason = checks.reason(record)
    _check_audited(node, uuid, record, checks.FAILED)
    logger.warning("node %s: card %s %s", node.id, record.get("index"), reason)
    if uuid in node.unhealthy_cards:
        return
    node_cards_health(
        node_id=node.id,
        unhealthy={
            uuid: {
                "index": record.get("index", device.get("index")),
                "name": device.get("name", ""),
                "reason": reason,
                "since": now.isoformat(),
            }
        },
        healthy={},
        now=now,
        owe_checks=False,
    )


def _check_audited(node: Node, uuid: str, record: dict, state: str) -> None:
    """A card's check ended ``state``: one node.card_check event, noted on its record."""
    record["audited"] = state
    audit_record(
        actor=HEALTH_CHECK,
        action="node.card_check",
        target=node,
        before={"card": {"uuid": uuid, "index": record.get("index"), "check": "running"}},
        after={
            "card": {
                "uuid": uuid,
                "index": record.get("index"),
                "check": state,
                "exit_code": record.get("exit_code"),
                "output": record.get("output", ""),
            }
        },
    )


def check_command_changed(command: NodeCommand, before: dict) -> None:
    """H5, an observer of every command's change (nodes.services.observers): a check's end
    and cleanup, and a member's cleanup (its cards owe a check before the next member)."""
    if command.kind != CommandKind.START:
        return
    cleaned_now = command.cleaned_at is not None and not before.get("cleaned")
    if not command.payload.get("health_check"):
        if cleaned_now:
            _cards_owed(command)
        return
    uuid = (command.payload.get("labels") or {}).get(checks.LABEL)
    fleet_id = Node.objects.filter(pk=command.node_id).values_list("fleet_id", flat=True).first()
    if fleet_id:  # its result may quarantine: the breaker before the node, as every flush
        health_breakers_lock([fleet_id])
    node = node_locked(command.node_id)
    record = node.card_checks.get(uuid)
    if record is None or record.get("command") != command.pk:
        return
    now = timezone.now()
    if command.state in ENDED and before.get("state") not in ENDED:
        record = _ended(node, uuid, record, command, now)
    if cleaned_now:
        record = checks.cleaned(record, now)
        if record["state"] == checks.PASSED:
            _passed_shown(node, uuid, record)
        if checks.placeable(record) and node.fleet_id:
            _allocate_on_commit(node.fleet_id)  # the card may take the work waiting for it
    records = dict(Node.objects.values_list("card_checks", flat=True).get(pk=node.pk))
    records[uuid] = record
    Node.objects.filter(pk=node.pk).update(card_checks=records)


def _ended(node: Node, uuid: str, record: dict, command: NodeCommand, now) -> dict:
    """A check's start ended: its result (none when it was lost with its node), the card
    quarantined or returned by it, and its cleanup sent."""
    if command.state != CommandState.LOST:
        passed = command.state == CommandState.SUCCEEDED and command.exit_code == 0
        known = record.get("result") is not None
        record = checks.finished(
            record,
            passed=passed,
            exit_code=command.exit_code,
            output=command.detail or command.reason,
            now=now,
        )
        if not known and not passed:
            _failed(node, uuid, record, now)
        elif not known and uuid in node.unhealthy_cards:
            config = node.fleet.config if node.fleet_id else {}
            needed = quarantine.health_returns_after(config)
            if record["passes"] >= needed:
                node_cards_health(
                    node_id=node.id,
                    unhealthy={},
                    healthy={uuid: f"its health check passed {record['passes']} times in a row"},
                    now=now,
                )
    if command.cleaned_at is None:
        node_commands_create_many(
            actor=HEALTH_CHECK,
            commands=[
                (node.id, CommandKind.CLEANUP, {"member": command.pk, "grace_seconds": CHECK_GRACE})
            ],
        )
    return record


def _passed_shown(node: Node, uuid: str, record: dict) -> None:
    """A card's check passed where it had not (never checked, failed, owed): audited; one
    that passes again is an observation."""
    if record.get("audited") != checks.PASSED:
        _check_audited(node, uuid, record, checks.PASSED)


def _cards_owed(command: NodeCommand) -> None:
    """A member's cleanup on a Fleet with a health check: each of its cards owes a check
    before the next member (H5)."""
    uuids = [card.get("uuid") for card in command.payload.get("cards") or []]
    if not uuids:
        return
    config = Node.objects.filter(pk=command.node_id).values_list("fleet__config", flat=True)
    if checks.HealthCheck.of(config.first()) is None:
        return  # one read, no lock, where the Fleet has no check
    node = node_locked(command.node_id)
    now = timezone.now()
    records = dict(node.card_checks)
    for uuid in uuids:
        owed = checks.owed(records.get(uuid), now)
        records[uuid] = owed if owed is not None else {"state": checks.DUE, "at": now.isoformat()}
        records[uuid].pop("audited", None)
    Node.objects.filter(pk=node.pk).update(card_checks=records)


def _allocate_on_commit(fleet_id: str) -> None:
    transaction.on_commit(lambda: current_app.tasks[ALLOCATE_TASK].delay(fleet_id))
