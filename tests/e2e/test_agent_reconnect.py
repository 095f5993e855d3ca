"""The real agent, in process, replaced by newer streams of its node again and again: one
heartbeat thread is left, for its live stream, and what finishes is reported on it. Found
by the gateway restart bench: old threads kept beating and took reports into dead queues."""

import json
import threading
import time
from pathlib import Path

import pytest
from django.utils import timezone

from audit.services import Actor
from nodes.agent.serve import Agent
from nodes.models import ControlSession, Node, NodeCommand
from nodes.services.commands import node_command_create
from tests.conftest import H100_INVENTORY
from tests.nodes.agent_process import inventory_file

from .agents import connect, credentials, lay_out_a_joined_node, running_gateway, wait_until

pytestmark = [pytest.mark.django_db(transaction=True)]


def heartbeat_threads() -> list[threading.Thread]:
    return [
        t
        for t in threading.enumerate()
        if getattr(getattr(t, "_target", None), "__name__", "") == "_heartbeat"
    ]


def test_after_reconnects_one_heartbeat_thread_beats_and_reports_what_finished(
    node_fleet, mint, admin_user, console_pki, tmp_path
):
    node, _, directory = lay_out_a_joined_node(node_fleet, mint, tmp_path)
    with running_gateway(tmp_path, console_pki) as target:
        agent = Agent(
            directory=directory,
            target=target,
            inventory_file=inventory_file(tmp_path, H100_INVENTORY),
            storage_root=None,
            cpu_budget=None,
            memory_budget_bytes=None,
        )
        runner = threading.Thread(target=agent.run, daemon=True)
        runner.start()
        try:
            wait_until(
                lambda: agent.call is not None and agent.call.is_active(),
                what="the agent connected",
            )
            for _ in range(3):  # a newer stream of the node replaces the agent's
                connect(target, credentials(directory), node.id)
                time.sleep(3)  # it reconnects after its backoff
            wait_until(
                lambda: agent.call is not None and agent.call.is_active(), what="the agent back"
            )
            wait_until(
                lambda: len(heartbeat_threads()) == 1, timeout=10, what="one heartbeat thread"
            )
            ids = [
                node_command_create(
                    actor=Actor.of_user(admin_user),
                    node=node,
                    kind="run",
                    payload={"argv": ["true"]},
                ).id
                for _ in range(3)
            ]
            wait_until(
                lambda: set(NodeCommand.objects.filter(pk__in=ids).values_list("state", flat=True))
                == {"succeeded"},
                timeout=20,
                what="every command reported succeeded",
            )
        finally:
            agent.stop()
            runner.join(10)


def test_a_reconnect_whose_inventory_the_console_holds_sends_none_and_stays_fresh(
    node_fleet, mint, console_pki, tmp_path
):
    """Issue 20: a reconnect is one Hello. The Welcome names the digest of the report the
    console holds; the agent, whose report has it, sends none, and its heartbeats carrying
    the digest keep the inventory fresh (L1). A changed inventory is still sent."""
    node, _, directory = lay_out_a_joined_node(node_fleet, mint, tmp_path)
    inventory = inventory_file(tmp_path, H100_INVENTORY)
    with running_gateway(tmp_path, console_pki, TUNEPLANE_HEARTBEAT_INTERVAL="1") as target:
        agent = Agent(
            directory=directory,
            target=target,
            inventory_file=inventory,
            storage_root=None,
            cpu_budget=None,
            memory_budget_bytes=None,
        )
        sent, send = [], agent._send_inventory

        def counting(*args, **kwargs):
            sent.append(send(*args, **kwargs))
            return sent[-1]

        agent._send_inventory = counting
        runner = threading.Thread(target=agent.run, daemon=True)
        runner.start()
        try:
            wait_until(
                lambda: Node.objects.get(pk=node.pk).inventory_digest, what="the first report"
            )
            assert sent.count(True) == 1  # enrolled: its report is what makes it schedulable
            first = ControlSession.objects.get(node=node, closed_at__isnull=True)
            connect(target, credentials(directory), node.id)  # replaces the agent's stream
            wait_until(
                lambda: ControlSession.objects.filter(node=node, closed_at__isnull=True)
                .exclude(pk=first.pk)
                .filter(agent_version=first.agent_version)
                .exists(),
                what="the agent reconnected",
            )
            reconnected = timezone.now()
            wait_until(
                lambda: Node.objects.get(pk=node.pk).inventory_observed_at > reconnected,
                what="a heartbeat renewing the inventory it did not resend",
            )
            assert sent.count(True) == 1
            changed = {**H100_INVENTORY, "cards": [{"name": "NVIDIA H100 80GB HBM3", "count": 4}]}
            Path(inventory).write_text(json.dumps(changed))
            wait_until(
                lambda: Node.objects.get(pk=node.pk).card_count == 4, what="the change reported"
            )
        finally:
            agent.stop()
            runner.join(10)
