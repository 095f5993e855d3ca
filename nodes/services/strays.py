"""Commands a node reports that the console never gave it (L5): flagged, never killed, and
bounded — a node's certificate is a credential on a machine we do not control, and it may
report any number of ids (issue 17, item 11)."""

from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import F

from audit.services import Actor, audit_record
from tuneplane.windows import first_in_window

from ..models import Node, StrayCommand

# Strays reported by one node: one audit event per kind (new, changed) a window, counting.
STRAY_WINDOW = 60


def node_strays_flag(*, node_id: str, reported: list, now: datetime) -> None:
    """Unknown to the console: flagged for an operator, never killed (L5). A node may say
    anything here: the most recently reported TUNEPLANE_STRAY_COMMANDS_KEPT are kept, older
    ones dropped and counted on the node, and one event a minute per node and kind (new,
    changed) says how many there were (as refused joins are audited, issue 17 items 5, 11).
    ``reported`` are the node's reports (commands.Reported) of ids it was never given."""
    kept = max(settings.TUNEPLANE_STRAY_COMMANDS_KEPT, 0)
    items = list({item.command_id: item for item in reported}.values())
    if not items:
        return
    strays = StrayCommand.objects.filter(node_id=node_id)
    with transaction.atomic(savepoint=False):
        _flag(node_id, items, strays, kept, now)


def _flag(node_id: str, items: list, strays, kept: int, now: datetime) -> None:
    known = {
        s.command_id: s
        for s in strays.select_for_update().filter(command_id__in=[i.command_id for i in items])
    }
    fresh = [i for i in items if i.command_id not in known]
    moved = [
        i
        for i in items
        if i.command_id in known
        and (known[i.command_id].state, known[i.command_id].exit_code) != (i.state, i.exit_code)
    ]
    if known:
        strays.filter(command_id__in=list(known)).update(last_reported_at=now)
    for item in moved:
        strays.filter(command_id=item.command_id).update(state=item.state, exit_code=item.exit_code)
    made = [
        StrayCommand(
            node_id=node_id,
            command_id=i.command_id,
            state=i.state,
            exit_code=i.exit_code,
            first_reported_at=now,
            last_reported_at=now,
        )
        for i in (fresh[-kept:] if kept else [])
    ]
    StrayCommand.objects.bulk_create(made, ignore_conflicts=True)
    dropped = len(fresh) - len(made)
    if fresh:
        # One DELETE, its subquery sorting at most this node's kept strays and these new ones.
        oldest = strays.order_by("-last_reported_at", "-id").values("pk")[kept:]
        dropped += strays.filter(pk__in=oldest).delete()[0]
    if dropped:
        Node.objects.filter(pk=node_id).update(strays_dropped=F("strays_dropped") + dropped)
    for kind, reports in (("new", fresh), ("changed", moved)):
        count = reports and first_in_window(
            "node-stray", node_id, kind, seconds=STRAY_WINDOW, delta=len(reports)
        )
        if count:
            _audit_stray(node_id, reports[-1], known.get(reports[-1].command_id), count)


def _audit_stray(node_id: str, reported, was: StrayCommand | None, count: int) -> None:
    before = None if was is None else {"state": was.state, "exit_code": was.exit_code}
    stray = StrayCommand.objects.filter(node_id=node_id, command_id=reported.command_id).first()
    audit_record(
        actor=Actor.of_node(node_id),
        action="node_command.stray_reported",
        target=stray or ("nodes.straycommand", f"{node_id}/{reported.command_id}"),
        before=before,
        after={
            "command": reported.command_id,
            "state": reported.state,
            "exit_code": reported.exit_code,
            "count": count,
            "window_seconds": STRAY_WINDOW,
        },
    )
