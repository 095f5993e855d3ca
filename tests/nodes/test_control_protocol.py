"""The control protocol as control.proto writes it down: the inventory digest a client must
compute to keep its inventory fresh with heartbeats alone (L1)."""

import hashlib
import re

from nodes.agent import wire
from nodes.agent.proto import control_pb2 as pb


def test_L1_the_inventory_digest_is_lowercase_hex_sha256_of_the_deterministic_serialization():
    report = pb.InventoryReport(
        cards=[pb.Card(name="NVIDIA H100 80GB HBM3", count=8)],
        driver="550.54",
        container_runtime="docker 24.0.7",
        storage_root_visible=True,
        cpu_budget=64,
        memory_budget_bytes=512 * 2**30,
    )
    digest = wire.inventory_digest(report)
    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    assert digest == hashlib.sha256(report.SerializeToString(deterministic=True)).hexdigest()
    # What a client in another language computes from the same fields, byte for byte.
    same = pb.InventoryReport()
    same.ParseFromString(report.SerializeToString(deterministic=True))
    assert wire.inventory_digest(same) == digest
