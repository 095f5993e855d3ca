"""Telemetry samples as a node's agent sends them, for the GPU health and telemetry tests: a
card's figures, a sample of every card of a node, and one stored as the gateway stores it.
The ``sampled_node`` fixture (tests/nodes/conftest.py) is a node whose first sample is in."""

from django.utils import timezone

from nodes.models import Node
from nodes.services.telemetry import telemetry_store


def card(device: dict, **values) -> dict:
    return {
        "index": device["index"],
        "uuid": device["uuid"],
        "name": device["name"],
        "utilization_percent": 50.0,
        "memory_used_bytes": 2**30,
        "memory_total_bytes": 80 * 2**30,
        "temperature_celsius": 60.0,
        "power_watts": 300.0,
        "ecc_corrected": 0,
        "ecc_uncorrected": 0,
        "xid_counts": {},
        **values,
    }


def sample(node: Node, changed: dict | None = None, *, without=(), source="file") -> dict:
    """A sample of every card of the node; ``changed`` by index, ``without`` left out."""
    changed = changed or {}
    return {
        "source": source,
        "cards": [
            card(device, **changed.get(device["index"], {}))
            for device in node.inventory["devices"]
            if device["index"] not in without
        ],
        "cpu_percent": 12.5,
        "memory_used_bytes": 2**34,
        "memory_total_bytes": 2**39,
    }


def send(node: Node, *args, at: float | None = None, **kwargs) -> dict:
    at = at if at is not None else timezone.now().timestamp()
    return telemetry_store(samples={node.id: (at, sample(node, *args, **kwargs))})
