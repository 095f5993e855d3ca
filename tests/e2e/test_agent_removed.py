"""A removed node's agent stops (D4, issue 49): the console refuses its credential for good, so
the real agent, served against a real gateway, exits non-zero at once and says how to join
again — it does not loop on "credential … is revoked". Which refusals are for good:
tests/nodes/test_agent_refusal.py."""

import signal

import pytest

from audit.services import Actor
from nodes.agent.serve import EXIT_REFUSED
from nodes.models import ControlSession
from nodes.services.drains import node_drain
from nodes.services.removal import node_remove

from .agents import serve, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_D4_a_removed_nodes_agent_stops_and_says_how_to_join_again(
    gateway, joined, admin_user, tmp_path
):
    node, env, directory = joined
    agent = serve(env, gateway, tmp_path, member_uids="none")
    try:
        wait_until(
            lambda: ControlSession.objects.filter(node=node, closed_at__isnull=True).exists(),
            what="the agent connected",
        )
        actor = Actor.of_user(admin_user)
        node_drain(actor=actor, node=node, reason="leaving the rack")
        node_remove(actor=actor, node=node)
        output = agent.communicate(timeout=40)[0]
    finally:
        if agent.returncode is None:
            agent.send_signal(signal.SIGKILL)
            agent.wait(10)
    assert agent.returncode == EXIT_REFUSED, output
    assert f"node {node.id} is removed" in output
    assert f"tuneplane join-token {node.fleet_id}" in output
    assert f"move {directory} aside" in output and "tuneplane-node join --server" in output
    assert output.count("stream ended") <= 2  # refused once, not retried
