"""Which of the console's refusals stop a node's agent for good (D4, issue 49): only the console
saying the node's credential is dead, revoked or expired; never a clock that is behind, a
console that is away or a hello throttled. The agent that stops on one: tests/e2e/
test_agent_removed.py."""

import grpc
import pytest

from nodes.agent.serve import how_to_join_again, refused_for_good


@pytest.mark.parametrize(
    ("code", "details", "final"),
    [
        (grpc.StatusCode.PERMISSION_DENIED, "node n-1 is removed: its credential is dead", True),
        (grpc.StatusCode.PERMISSION_DENIED, "credential 1f is revoked", True),
        (grpc.StatusCode.PERMISSION_DENIED, "credential 1f has expired", True),
        (grpc.StatusCode.PERMISSION_DENIED, "credential 1f is not valid yet", False),  # a clock
        (grpc.StatusCode.UNAVAILABLE, "node n-1 is removed", False),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "too many hellos", False),
    ],
)
def test_D4_only_a_refusal_for_good_stops_the_agent(code, details, final):
    assert refused_for_good(code, details) is final


def test_D4_the_agent_that_stops_says_how_to_join_again():
    said = how_to_join_again(
        {"server": "https://console:8000", "fleet": "gpu-a", "node_id": 7},
        "/var/lib/tuneplane-node",
        "node 7 is removed",
    )
    assert said.startswith("the console refuses node 7 for good: node 7 is removed.")
    assert "tuneplane join-token gpu-a" in said
    assert "move /var/lib/tuneplane-node aside" in said
    assert "tuneplane-node join --server https://console:8000 --fleet gpu-a --token TOKEN" in said
