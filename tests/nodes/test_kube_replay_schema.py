"""The replay's node fixtures (tests/nodes/kube_responses) are what a real API server could
send: checked against the Node schema of the Kubernetes API the official client ships
(tests/nodes/kube_schema.py). read() stays on the replay — a node list needs the full
kube-apiserver — so these checks are what keep its fixtures honest."""

import copy
import json

import pytest

from .kube_replay import RESPONSES
from .kube_schema import violations

NODE_FIXTURES = ["nodes.json"]


@pytest.mark.parametrize("fixture", NODE_FIXTURES)
def test_each_replayed_node_list_is_one_the_api_allows(fixture):
    node_list = json.loads((RESPONSES / fixture).read_text())

    assert node_list["kind"] == "NodeList" and node_list["apiVersion"] == "v1"
    assert violations(node_list, "V1NodeList") == []


def _nodes():
    return json.loads((RESPONSES / "nodes.json").read_text())


@pytest.mark.parametrize(
    "break_it, named",
    [
        (
            lambda n: n["items"][0]["status"]["capacity"].update({"nvidia.com/gpu": 8}),
            ".items[0].status.capacity.nvidia.com/gpu: a quantity string expected, got 8",
        ),
        (
            lambda n: n["items"][0]["status"].update({"gpus": 8}),
            ".items[0].status.gpus: no such field in V1NodeStatus",
        ),
        (
            lambda n: n["items"][0]["spec"].update({"unschedulable": "true"}),
            ".items[0].spec.unschedulable: bool expected, got 'true'",
        ),
        (
            lambda n: n["items"][0]["status"]["conditions"][-1].update({"status": "Yes"}),
            ".items[0].status.conditions[-1].status",
        ),
        (
            lambda n: n["items"][0]["status"]["conditions"][-1].pop("type"),
            "Invalid value for `type`, must not be `None`",
        ),
        (
            lambda n: n["items"][0]["metadata"].update({"creation_timestamp": "2024-09-30"}),
            ".items[0].metadata.creation_timestamp: no such field in V1ObjectMeta",
        ),
    ],
    ids=[
        "quantity-as-number",
        "unknown-field",
        "bool-as-string",
        "condition-status",
        "condition-without-type",
        "python-name-not-json-name",
    ],
)
def test_a_fixture_no_server_would_send_is_named(break_it, named):
    """The check itself, broken fixture by broken fixture."""
    node_list = copy.deepcopy(_nodes())
    break_it(node_list)

    found = violations(node_list, "V1NodeList")
    last = len(node_list["items"][0]["status"]["conditions"]) - 1
    assert any(named.replace("[-1]", f"[{last}]") in line for line in found), found
