"""Commands to nodes and their reconciliation (L5): every write in one transaction, audited.

The console records a command as pending; the gateway holding the node's
stream delivers it; the agent persists it in its state dir before it answers
"running". A lost connection is not a dead process: on reconnect the node's
Hello carries the durable state of every command it knows, and
``node_commands_reconcile`` settles the two views — nothing is killed for it.
"""

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.services import Actor, audit_record, audit_record_many
from tuneplane.errors import Conflict, ValidationFailed

from .. import bus
from ..choices import (
    ACTIVE_COMMAND_STATES,
    COMMAND_LIFECYCLE,
    CommandKind,
    CommandState,
    SchedulingState,
)
from ..models import Node, NodeCommand
from .cordons import node_observe_unkillable
from .drains import node_drain_settle
from .observers import command_changed
from .shapes import member_payload, member_ref_payload, run_payload
from .strays import node_strays_flag

# What a node may say of a command; "pending" and "lost" are the console's words.
REPORTABLE = {CommandState.RUNNING, CommandState.SUCCEEDED, CommandState.FAILED}
FINISHED = {CommandState.SUCCEEDED, CommandState.FAILED}
# A member in one of these may be cleaned up: nothing of it should run any more.
ENDED = {*FINISHED, CommandState.LOST}


MAX_REASON = 32
MAX_CONFINEMENT = 200
MAX_DETAIL = 200
MAX_RESTARTS = 2**31 - 1


@dataclass(frozen=True)
class Reported:
    """One command as the node reports it, from its state dir: for a member (kind start),
    also why it ended, whether it is cleaned up and how it is confined."""

    command_id: str
    state: str
    exit_code: int | None = None
    reason: str = ""
    cleaned: bool = False
    confinement: str = ""
    # A serving member's (S1): its probe passes, its restarts, the probe's error.
    ready: bool = False
    restarts: int = 0
    detail: str = ""
    # H4: when the node last saw the member mark a checkpoint (None: never).
    checkpoint_at: datetime | None = None

    @classmethod
    def of(cls, command_id: str, state: str, exit_code: int, **member) -> "Reported":
        """From the wire, where an unset exit code reads 0: only a finished command has one."""
        return checked(cls(command_id, state, exit_code if state in FINISHED else None, **member))

    @classmethod
    def from_wire(cls, message) -> "Reported":
        """A CommandState as the agent sent it."""
        return cls.of(
            message.command_id,
            message.state,
            message.exit_code,
            reason=message.reason[:MAX_REASON],
            cleaned=message.cleaned,
            confinement=message.confinement[:MAX_CONFINEMENT],
            ready=message.ready,
            restarts=min(message.restarts, MAX_RESTARTS),
            detail=message.detail[:MAX_DETAIL],
            checkpoint_at=checkpoint_time(message.checkpoint_at, timezone.now()),
        )


def checkpoint_time(seconds: float, now: datetime) -> datetime | None:
    """A node's checkpoint time as the console keeps it: none for 0 (or what is no time at
    all), never later than the console's own now (a node's clock may run ahead)."""
    if not math.isfinite(seconds) or seconds <= 0:
        return None
    try:
        found = datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return min(found, now)


_PAYLOADS = {
    CommandKind.RUN: run_payload,
    CommandKind.START: member_payload,
    CommandKind.STOP: member_ref_payload,
    CommandKind.CLEANUP: member_ref_payload,
}


def _payload(kind: str, payload) -> dict:
    if kind not in CommandKind.values:
        raise ValidationFailed(
            f"kind must be one of {', '.join(CommandKind.values)}.", field="kind"
        )
    return _PAYLOADS[kind](payload)


def node_commands_create_many(*, actor: Actor, commands: list[tuple[str, str, dict]]):
    """Several commands ``(node id, kind, payload)`` at once, in the caller's transaction, in
    a number of statements that does not grow with them: the allocator's batch. A removed
    node takes none (D4): the whole batch is refused."""
    checked = [(node_id, kind, _payload(kind, payload)) for node_id, kind, payload in commands]
    now = timezone.now()
    node_ids = sorted({node_id for node_id, _, _ in checked})
    with transaction.atomic():
        removed = list(
            Node.objects.select_for_update(no_key=True)
            .filter(pk__in=node_ids, scheduling_state=SchedulingState.REMOVED)
            .values_list("pk", flat=True)
        )
        if removed:
            raise Conflict(
                f"Node '{removed[0]}' is removed: it takes no commands (rule D4).",
                rule="D4",
                code="node_removed",
            )
        created = NodeCommand.objects.bulk_create(
            [
                NodeCommand(
                    node_id=node_id,
                    kind=kind,
                    payload=payload,
                    created_by=actor.label,
                    created_at=now,
                    updated_at=now,
                )
                for node_id, kind, payload in checked
            ]
        )
        audit_record_many(
            actor=actor,
            action="node_command.created",
            target_type=NodeCommand._meta.label_lower,
            changes=[
                (
                    command.pk,
                    None,
                    {
                        "node": command.node_id,
                        "kind": command.kind,
                        "payload": payload_shown(command),
                    },
                )
                for command in created
            ],
        )
        for node_id in node_ids:
            bus.publish_on_commit(bus.COMMANDS, node_id)
    return created


def payload_shown(command: NodeCommand) -> dict:
    """A payload as the audit keeps it and the API shows it: a member's env values are its
    job's secrets, shown by name only."""
    if command.kind != CommandKind.START:
        return command.payload
    return {**command.payload, "env": sorted(command.payload.get("env") or {})}


def node_command_create(*, actor: Actor, node: Node, kind: str, payload) -> NodeCommand:
    """Record a command for a node; the gateway holding its stream delivers it. Only a
    ``run``: a job's members are started, stopped and cleaned up by placement's allocator
    and runs (DESIGN §7), which hold their cards and follow their reports."""
    if kind in (CommandKind.START, CommandKind.STOP, CommandKind.CLEANUP):
        raise ValidationFailed(
            f"kind: a {kind} command is the allocator's (a job's member); send a run.",
            field="kind",
        )
    payload = _payload(kind, payload)
    now = timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
        if node.scheduling_state == SchedulingState.REMOVED:
            raise Conflict(
                f"Node '{node.id}' is removed: it takes no commands (rule D4).",
                rule="D4",
                code="node_removed",
            )
        command = NodeCommand.objects.create(
            node=node,
            kind=kind,
            payload=payload,
            created_by=actor.label,
            created_at=now,
            updated_at=now,
        )
        audit_record(
            actor=actor,
            action="node_command.created",
            target=command,
            after={"node": node.id, "kind": kind, "payload": payload},
        )
        bus.publish_on_commit(bus.COMMANDS, node.id)
    return command


def _view(command: NodeCommand) -> dict:
    view = {"state": command.state, "exit_code": command.exit_code}
    if command.kind == CommandKind.START:
        view.update(
            reason=command.reason,
            cleaned=command.cleaned_at is not None,
            confinement=command.confinement,
        )
        if command.payload.get("serve"):
            view.update(ready=command.ready, restarts=command.restarts, detail=command.detail)
        elif command.payload.get("health_check") and command.detail:
            view.update(detail=command.detail)  # H5: the check's output, its tail
        if command.checkpointed_at is not None:
            view.update(checkpointed_at=command.checkpointed_at.isoformat())
    return view


def _apply(command: NodeCommand, reported: Reported, now: datetime) -> bool:
    """Move a command to what its node reports. A finished command stays finished; a
    member's cleanup (once) and a reason that comes later (unkillable) still move it."""
    before = _view(command)
    if command.state not in FINISHED:
        COMMAND_LIFECYCLE.check(command.state, reported.state, target=command.pk)
        command.state, command.exit_code = reported.state, reported.exit_code
    if command.kind == CommandKind.START:
        if reported.reason and (command.state == reported.state or reported.state == "running"):
            command.reason = reported.reason
        command.confinement = reported.confinement or command.confinement
        if command.state == CommandState.RUNNING and command.payload.get("serve"):
            # A replica's reason comes and goes as it restarts (S1).
            command.reason = reported.reason if reported.state == "running" else command.reason
            command.ready, command.detail = reported.ready, reported.detail
            command.restarts = max(command.restarts, reported.restarts)
        elif command.state in ENDED:
            command.ready = False
            if command.payload.get("health_check") and reported.detail:
                command.detail = reported.detail
        if reported.cleaned and command.cleaned_at is None and command.state in ENDED:
            command.cleaned_at = now
        if reported.checkpoint_at and (
            command.checkpointed_at is None or reported.checkpoint_at > command.checkpointed_at
        ):
            command.checkpointed_at = reported.checkpoint_at  # H4: only ever later
    elif reported.reason and before["state"] != command.state:
        command.reason = reported.reason  # a cleanup's "unknown_member", say
    after = _view(command)
    if after == before:
        return False
    command.updated_at = now
    command.save(
        update_fields=[
            *("state", "exit_code", "reason", "confinement", "cleaned_at", "updated_at"),
            *("ready", "restarts", "detail", "checkpointed_at"),
        ]
    )
    cleaned = after.get("cleaned") and not before.get("cleaned")
    audit_record(
        actor=Actor.of_node(command.node_id),
        action="node_command.cleaned"
        if cleaned and before["state"] == after["state"]
        else f"node_command.{command.state}",
        target=command,
        before=before,
        after=after,
    )
    command_changed(command, before)
    if "unkillable" in (before.get("reason"), after.get("reason")) or (
        cleaned and before.get("reason") == "unkillable"
    ):
        node_observe_unkillable(node_id=command.node_id)
    if not command_active(command):
        node_drain_settle(node_id=command.node_id)
    return True


def command_active(command: NodeCommand) -> bool:
    """May still run, or (a member) still holds what it was given on its node."""
    return command.state in ACTIVE_COMMAND_STATES or (
        command.kind == CommandKind.START and command.cleaned_at is None
    )


def node_command_lost(*, command: NodeCommand, reason: str = "") -> bool:
    """The console gives up on a command (a member whose node is gone past the reconcile
    deadline, R8): recorded lost, audited, observers told. Call inside a transaction."""
    return _apply(command, Reported(command.id, CommandState.LOST, reason=reason), timezone.now())


def node_command_cleaned_by_id(*, command: NodeCommand) -> bool:
    """A member's cleanup confirmed by its cleanup command (the node may no longer know the
    member itself: it cleaned by id, R7)."""
    if command.state not in ENDED or command.cleaned_at is not None:
        return False
    before = _view(command)
    command.cleaned_at = timezone.now()
    command.updated_at = command.cleaned_at
    command.save(update_fields=["cleaned_at", "updated_at"])
    audit_record(
        actor=Actor.of_node(command.node_id),
        action="node_command.cleaned",
        target=command,
        before=before,
        after=_view(command),
    )
    command_changed(command, before)
    node_drain_settle(node_id=command.node_id)
    return True


def checked(reported: Reported) -> Reported:
    """A node's report, refused whole if it names a state a node cannot report."""
    if reported.state not in REPORTABLE or not reported.command_id or len(reported.command_id) > 64:
        raise ValidationFailed(
            f"command state {reported.state!r} for "
            f"{reported.command_id[:64]!r} is not one a node reports.",
            field="command.state",
        )
    return reported


def node_command_report(*, node_id: str, reported: Reported) -> None:
    """A node's CommandUpdate. Only the node's own commands move; others are strays."""
    reported = checked(reported)
    now = timezone.now()
    with transaction.atomic():
        command = (
            NodeCommand.objects.select_for_update()
            .filter(pk=reported.command_id, node_id=node_id)
            .first()
        )
        if command is None:
            node_strays_flag(node_id=node_id, reported=[reported], now=now)
        else:
            _apply(command, reported, now)


def node_commands_reconcile(*, node_id: str, reported: list[Reported]) -> list[NodeCommand]:
    """L5, at Hello: settle what the console recorded against what the node knows.

    Known to both and running: stays running. Finished on the node: recorded.
    Running on the console's books but unknown to the node: lost. Unknown to
    the console: flagged. Pending (never acknowledged): returned, to deliver.
    """
    return nodes_commands_reconcile(reported={node_id: reported})[node_id]


def nodes_commands_reconcile(
    *, reported: dict[str, list[Reported]]
) -> dict[str, list[NodeCommand]]:
    """``node_commands_reconcile`` for the Hellos of many nodes at once: their commands read
    and locked in one statement; only what changed is written. Each node's pending ones."""
    reported = {node: [checked(item) for item in items] for node, items in reported.items()}
    by_key = {(node, item.command_id): item for node, items in reported.items() for item in items}
    now = timezone.now()
    pending: dict[str, list[NodeCommand]] = {node_id: [] for node_id in reported}
    with transaction.atomic():
        commands = list(
            NodeCommand.objects.select_for_update()
            .filter(node_id__in=list(reported))
            .filter(Q(state__in=ACTIVE_COMMAND_STATES) | Q(pk__in=[i for _, i in by_key]))
            .order_by("created_at")
        )
        known = {(command.node_id, command.id) for command in commands}
        for command in commands:
            mine = by_key.get((command.node_id, command.id))
            if mine is not None:
                _apply(command, mine, now)
            elif command.state == CommandState.RUNNING:
                _apply(command, Reported(command.id, CommandState.LOST), now)
            if command.state == CommandState.PENDING:
                pending[command.node_id].append(command)
        for node_id, items in reported.items():
            node_strays_flag(
                node_id=node_id,
                reported=[item for item in items if (node_id, item.command_id) not in known],
                now=now,
            )
    return pending
