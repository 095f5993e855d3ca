"""Commands to nodes and their reconciliation (L5): every write in one transaction, audited.

The console records a command as pending; the gateway holding the node's
stream delivers it; the agent persists it in its state dir before it answers
"running". A lost connection is not a dead process: on reconnect the node's
Hello carries the durable state of every command it knows, and
``node_commands_reconcile`` settles the two views — nothing is killed for it.
"""

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.services import Actor, audit_record
from tuneplane.errors import Conflict, ValidationFailed

from .. import bus
from ..choices import ACTIVE_COMMAND_STATES, CommandKind, CommandState, SchedulingState
from ..models import Node, NodeCommand, StrayCommand
from .scheduling import node_drain_settle

MAX_ARGV = 64
MAX_ARG_CHARS = 4096
# What a node may say of a command; "pending" and "lost" are the console's words.
REPORTABLE = {CommandState.RUNNING, CommandState.SUCCEEDED, CommandState.FAILED}
FINISHED = {CommandState.SUCCEEDED, CommandState.FAILED}


@dataclass(frozen=True)
class Reported:
    """One command as the node reports it, from its state dir."""

    command_id: str
    state: str
    exit_code: int | None = None

    @classmethod
    def of(cls, command_id: str, state: str, exit_code: int) -> "Reported":
        """From the wire, where an unset exit code reads 0: only a finished command has one."""
        return checked(cls(command_id, state, exit_code if state in FINISHED else None))


def _run_payload(payload) -> dict:
    if not isinstance(payload, dict) or set(payload) != {"argv"}:
        raise ValidationFailed('payload of a run command must be {"argv": [...]}.', field="payload")
    argv = payload["argv"]
    if (
        not isinstance(argv, list)
        or not 1 <= len(argv) <= MAX_ARGV
        or not all(isinstance(arg, str) and len(arg) <= MAX_ARG_CHARS for arg in argv)
        or not argv[0]
    ):
        raise ValidationFailed(
            f"payload.argv must be 1 to {MAX_ARGV} strings, the first naming the program.",
            field="payload.argv",
        )
    return {"argv": argv}


def node_command_create(*, actor: Actor, node: Node, kind: str, payload) -> NodeCommand:
    """Record a command for a node; the gateway holding its stream delivers it."""
    if kind not in CommandKind.values:
        raise ValidationFailed(
            f"kind must be one of {', '.join(CommandKind.values)}.", field="kind"
        )
    payload = _run_payload(payload)
    now = timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
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


def _apply(command: NodeCommand, reported: Reported, now: datetime) -> bool:
    """Move a command to what its node reports; a finished command stays finished."""
    if command.state in FINISHED or (
        command.state == reported.state and command.exit_code == reported.exit_code
    ):
        return False
    before = {"state": command.state, "exit_code": command.exit_code}
    command.state = reported.state
    command.exit_code = reported.exit_code
    command.updated_at = now
    command.save(update_fields=["state", "exit_code", "updated_at"])
    audit_record(
        actor=Actor.of_node(command.node_id),
        action=f"node_command.{reported.state}",
        target=command,
        before=before,
        after={"state": command.state, "exit_code": command.exit_code},
    )
    if command.state not in ACTIVE_COMMAND_STATES:
        node_drain_settle(node_id=command.node_id)
    return True


def _flag_stray(node_id: str, reported: Reported, now: datetime) -> None:
    """Unknown to the console: flagged for an operator, never killed (L5)."""
    stray = (
        StrayCommand.objects.select_for_update()
        .filter(node_id=node_id, command_id=reported.command_id)
        .first()
    )
    if stray is not None and (stray.state, stray.exit_code) == (reported.state, reported.exit_code):
        StrayCommand.objects.filter(pk=stray.pk).update(last_reported_at=now)
        return
    before = None if stray is None else {"state": stray.state, "exit_code": stray.exit_code}
    if stray is None:
        stray = StrayCommand(node_id=node_id, command_id=reported.command_id, first_reported_at=now)
    stray.state, stray.exit_code, stray.last_reported_at = (reported.state, reported.exit_code, now)
    stray.save()
    audit_record(
        actor=Actor.of_node(node_id),
        action="node_command.stray_reported",
        target=stray,
        before=before,
        after={
            "command": reported.command_id,
            "state": reported.state,
            "exit_code": reported.exit_code,
        },
    )


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
            _flag_stray(node_id, reported, now)
        else:
            _apply(command, reported, now)


def node_commands_reconcile(*, node_id: str, reported: list[Reported]) -> list[NodeCommand]:
    """L5, at Hello: settle what the console recorded against what the node knows.

    Known to both and running: stays running. Finished on the node: recorded.
    Running on the console's books but unknown to the node: lost. Unknown to
    the console: flagged. Pending (never acknowledged): returned, to deliver.
    """
    reported = [checked(item) for item in reported]
    by_id = {item.command_id: item for item in reported}
    now = timezone.now()
    with transaction.atomic():
        commands = list(
            NodeCommand.objects.select_for_update()
            .filter(node_id=node_id)
            .filter(Q(state__in=ACTIVE_COMMAND_STATES) | Q(pk__in=list(by_id)))
            .order_by("created_at")
        )
        known = {command.id for command in commands}
        for command in commands:
            if command.id in by_id:
                _apply(command, by_id[command.id], now)
            elif command.state == CommandState.RUNNING:
                _apply(command, Reported(command.id, CommandState.LOST), now)
        for item in reported:
            if item.command_id not in known:
                _flag_stray(node_id, item, now)
    return [command for command in commands if command.state == CommandState.PENDING]
