"""Commands and their reconciliation at reconnect (L5), through the services."""

import pytest

from audit.models import AuditEvent
from nodes.choices import CommandState
from nodes.models import NodeCommand, StrayCommand
from nodes.selectors import commands_pending
from nodes.services.commands import (
    Reported,
    node_command_create,
    node_command_report,
    node_commands_reconcile,
)
from nodes.services.join import node_join
from tests.conftest import H100_INVENTORY, SYSTEM, make_csr
from tuneplane.errors import ValidationFailed

RUN = {"argv": ["sleep", "600"]}


@pytest.fixture
def join(node_fleet, mint):
    def joined():
        return node_join(
            token=mint(node_fleet)[1],
            fleet_id="gpu-lab",
            csr=make_csr()[1],
            inventory=H100_INVENTORY,
        ).node

    return joined


def command(node, state=CommandState.PENDING):
    made = node_command_create(actor=SYSTEM, node=node, kind="run", payload=RUN)
    if state != "pending":
        NodeCommand.objects.filter(pk=made.pk).update(state=state)
    return NodeCommand.objects.get(pk=made.pk)


def actions_on(command_id):
    return list(
        AuditEvent.objects.filter(target_id=command_id)
        .order_by("id")
        .values_list("action", flat=True)
    )


def test_a_command_is_recorded_pending_and_audited(join):
    node = join()
    made = command(node)
    assert made.state == CommandState.PENDING and made.payload == RUN and made.created_by == "tests"
    assert actions_on(made.id) == ["node_command.created"]
    assert [c.id for c in commands_pending(node_id=node.id)] == [made.id]


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"argv": []}, "payload.argv"),
        ({"argv": "sleep 1"}, "payload.argv"),
        ({"argv": ["sleep", 1]}, "payload.argv"),
        ({"cmd": ["sleep"]}, "payload"),
        (["sleep"], "payload"),
        ({"argv": [""]}, "payload.argv"),
    ],
)
def test_a_bad_command_names_its_field_and_writes_nothing(join, payload, field):
    node = join()
    with pytest.raises(ValidationFailed) as refused:
        node_command_create(actor=SYSTEM, node=node, kind="run", payload=payload)
    assert refused.value.field == field
    assert not NodeCommand.objects.exists()


def test_L5_reconnect_reconciles_every_case_and_kills_nothing(join):
    node = join()
    still_running = command(node, "running")
    finished_offline = command(node, "running")
    forgotten = command(node, "running")
    never_delivered = command(node)
    already_done = command(node, "succeeded")

    to_deliver = node_commands_reconcile(
        node_id=node.id,
        reported=[
            Reported(still_running.id, "running"),
            Reported(finished_offline.id, "failed", 3),
            Reported("c-the-console-never-gave-this", "running"),
        ],
    )

    def state(cmd):
        cmd.refresh_from_db()
        return cmd.state, cmd.exit_code

    assert state(still_running) == ("running", None)
    assert actions_on(still_running.id) == ["node_command.created"]  # no change, no event
    assert state(finished_offline) == ("failed", 3)
    assert actions_on(finished_offline.id)[-1] == "node_command.failed"
    assert state(forgotten) == ("lost", None)
    assert actions_on(forgotten.id)[-1] == "node_command.lost"
    assert [c.id for c in to_deliver] == [never_delivered.id]
    assert state(never_delivered) == ("pending", None)
    assert state(already_done) == ("succeeded", None)
    stray = StrayCommand.objects.get(node=node)
    assert (stray.command_id, stray.state) == ("c-the-console-never-gave-this", "running")
    assert AuditEvent.objects.filter(action="node_command.stray_reported").count() == 1
    # Flagged, not made into a command the console would manage (or kill).
    assert not NodeCommand.objects.filter(pk="c-the-console-never-gave-this").exists()


def test_L5_reconciling_the_same_report_twice_changes_nothing_more(join):
    node = join()
    running = command(node, "running")
    report = [Reported(running.id, "succeeded", 0), Reported("c-stray", "running")]
    node_commands_reconcile(node_id=node.id, reported=report)
    events = AuditEvent.objects.count()
    node_commands_reconcile(node_id=node.id, reported=report)
    assert AuditEvent.objects.count() == events
    assert StrayCommand.objects.count() == 1


def test_a_finished_command_stays_finished(join):
    node = join()
    done = command(node, "succeeded")
    node_command_report(node_id=node.id, reported=Reported(done.id, "running"))
    done.refresh_from_db()
    assert done.state == CommandState.SUCCEEDED


def test_a_node_cannot_report_for_another_nodes_command(join):
    mine, theirs = join(), join()
    their_command = command(theirs, "running")
    node_command_report(node_id=mine.id, reported=Reported(their_command.id, "failed", 9))
    their_command.refresh_from_db()
    assert their_command.state == CommandState.RUNNING
    assert StrayCommand.objects.get().node_id == mine.id


@pytest.mark.parametrize("state", ["pending", "lost", "exploded", ""])
def test_a_node_reports_only_states_a_node_can_know(join, state):
    node = join()
    with pytest.raises(ValidationFailed):
        Reported.of(command(node).id, state, 0)


def test_an_unset_exit_code_is_no_exit_code_while_running():
    assert Reported.of("c-1", "running", 0).exit_code is None
    assert Reported.of("c-1", "succeeded", 0).exit_code == 0


def test_item11_a_node_keeps_at_most_n_strays_the_oldest_counted(join, settings):
    settings.TUNEPLANE_STRAY_COMMANDS_KEPT = 5
    node = join()
    node_commands_reconcile(
        node_id=node.id, reported=[Reported(f"c-h{i}", "running") for i in range(8)]
    )
    for i in range(3):
        node_command_report(node_id=node.id, reported=Reported(f"c-u{i}", "running"))
    kept = set(StrayCommand.objects.filter(node=node).values_list("command_id", flat=True))
    assert kept == {"c-h6", "c-h7", "c-u0", "c-u1", "c-u2"}
    node.refresh_from_db()
    assert node.strays_dropped == 6
    # A kept stray reported again stays, and is the most recent: it outlives a newer one.
    node_command_report(node_id=node.id, reported=Reported("c-h6", "failed", 1))
    node_command_report(node_id=node.id, reported=Reported("c-u3", "running"))
    kept = set(StrayCommand.objects.filter(node=node).values_list("command_id", flat=True))
    assert kept == {"c-h6", "c-u0", "c-u1", "c-u2", "c-u3"}  # c-h7 was the oldest
    assert StrayCommand.objects.get(node=node, command_id="c-h6").state == "failed"
    node.refresh_from_db()
    assert node.strays_dropped == 7


def test_item11_stray_audit_events_are_one_a_minute_per_node_with_a_count(join):
    from django.core.cache import cache

    from tuneplane import windows

    node, other = join(), join()
    hello = [Reported(f"c-h{i}", "running") for i in range(1000)]  # the most a Hello carries
    node_commands_reconcile(node_id=node.id, reported=hello)
    for i in range(20):
        node_command_report(node_id=node.id, reported=Reported(f"c-u{i}", "running"))
    node_command_report(node_id=other.id, reported=Reported("c-u0", "running"))
    events = AuditEvent.objects.filter(action="node_command.stray_reported").order_by("id")
    assert [(e.actor_id, e.after["count"]) for e in events.all()] == [
        (node.id, 1000),
        (other.id, 1),
    ]
    cache.delete(windows._key("node-stray", (node.id, "new")) + ":open")  # the minute ends
    node_command_report(node_id=node.id, reported=Reported("c-last", "running"))
    assert events.count() == 3
    assert events.last().after == {
        "command": "c-last",
        "state": "running",
        "exit_code": None,
        "count": 21,  # the 20 not recorded before, and this one
        "window_seconds": 60,
    }
