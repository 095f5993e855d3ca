"""Fixtures the placement tests share."""

import pytest


@pytest.fixture
def two_nodes(node_fleet, gpu_node):
    """Two placeable nodes of eight cards on the node Fleet."""
    return [gpu_node(node_fleet, address=f"10.0.0.{n}:1") for n in (1, 2)]
