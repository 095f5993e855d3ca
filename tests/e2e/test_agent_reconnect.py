"""The real agent, in process, replaced by newer streams of its node again and again: one
heartbeat thread is left, for its live stream, and what finishes is reported on it. Found
by the gateway restart bench: old threads kept beating and took reports into dead queues."""

import threading
import time

import pytest

from audit.services import Actor
from nodes.agent.serve import Agent
from nodes.models import NodeCommand
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
