"""Telemetry and GPU health for real (issue 19): a grpcserve subprocess over mTLS with its
metrics port, the real agent reading a fake telemetry source (a file, as on a machine
without GPUs), the test's PostgreSQL. Samples arrive on their own message, the console
keeps the latest, the gateway exports them by node and card, and a fake XID takes a card
out of placement and puts it back; every card unhealthy cordons the node (gpu-health) and an
operator's cordon outlives it (L6). The agent sends a sample only when it says something new
(a health change at once, a figure beyond its deadband) or the refresh is due: an unchanged
file is not sent again within the refresh period, a change beyond a deadband is."""

import json
import os
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from audit.models import AuditEvent
from audit.services import Actor
from nodes.agent.wire import TELEMETRY_REFRESH_INTERVALS
from nodes.choices import CordonSource
from nodes.models import Node, NodeCordon, NodeTelemetry
from nodes.services.cordons import node_cordon
from tests.conftest import H100_DEVICE_INVENTORY, H100_DEVICES

from .agents import lay_out_a_joined_node, running_gateway, serve, wait_until
from .console import free_port

pytestmark = pytest.mark.django_db(transaction=True)


def card(device: dict, **values) -> dict:
    return {
        "index": device["index"],
        "uuid": device["uuid"],
        "name": device["name"],
        "utilization_percent": 40.0 + device["index"],
        "memory_used_bytes": 2**34,
        "memory_total_bytes": 80 * 2**30,
        "temperature_celsius": 61.0,
        "power_watts": 350.0,
        "ecc_corrected": 0,
        "ecc_uncorrected": 0,
        "xid_counts": {},
        **values,
    }


def write(path, changed: dict | None = None, host: dict | None = None) -> None:
    """The cards, ``changed`` by index; the host's figures the file's when given, else the
    machine's (which may move beyond a deadband, and be sent, at any sample)."""
    changed = changed or {}
    cards = [card(device, **changed.get(device["index"], {})) for device in H100_DEVICES]
    # Whole or not at all: an agent reading the file half-written would send a sample whose
    # probe failed (its cards kept as they were) — news of its own, not the change written.
    written = path.with_name(path.name + ".new")
    written.write_text(json.dumps({"cards": cards, **({"host": host} if host else {})}))
    os.replace(written, path)


def scrape(target: str) -> dict:
    with urllib.request.urlopen(f"http://{target}/metrics", timeout=10) as response:
        text = response.read().decode()
    figures = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            figures[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        figures[("type", family.name)] = family.type
    return figures


def labelled(figures: dict, name: str, **labels) -> float | None:
    for (metric, pairs), value in figures.items():
        if metric == name and labels.items() <= dict(pairs).items():
            return value
    return None


def test_telemetry_rides_the_stream_and_a_fake_xid_moves_the_card_out_and_back(
    tmp_path, console_pki, node_fleet, mint, admin_user
):
    node, env, _ = lay_out_a_joined_node(node_fleet, mint, tmp_path)
    source = tmp_path / "telemetry.json"
    write(source)
    metrics = f"127.0.0.1:{free_port()}"
    settings = {
        "TUNEPLANE_GATEWAY_METRICS_BIND": metrics,
        "TUNEPLANE_TELEMETRY_INTERVAL": "1",
        "TUNEPLANE_TELEMETRY_FLUSH_INTERVAL": "1",
        "TUNEPLANE_GPU_HEALTH_QUIET": "4",
        # Every card of the one node fails below: past any share of H7's breaker but 1.
        "TUNEPLANE_HEALTH_BREAKER_SHARE": "1",
    }
    # Healthy again needs a sample after the quiet period: a steady node's next is its
    # refresh, 20 intervals (20 s here) after the fault's.
    lifted_within = TELEMETRY_REFRESH_INTERVALS + 25
    with running_gateway(tmp_path, console_pki, **settings) as target:
        agent = serve(
            env, target, tmp_path, "--telemetry-file", str(source), inventory=H100_DEVICE_INVENTORY
        )
        try:
            row = wait_until(
                lambda: NodeTelemetry.objects.filter(node=node).first(), what="a stored sample"
            )
            assert row.source == "file" and len(row.cards) == 8 and row.host["memory_total_bytes"]
            figures = wait_until(
                lambda: (f := scrape(metrics))
                and labelled(f, "tuneplane_gpu_utilization_percent", node=node.id, card="3")
                and f,
                what="the card's figures on the gateway's metrics",
            )
            assert labelled(figures, "tuneplane_gpu_utilization_percent", card="3") == 43.0
            assert figures[("type", "tuneplane_gpu_utilization_percent")] == "gauge"
            assert figures[("type", "tuneplane_gateway_heartbeats")] == "counter"
            assert figures[("type", "tuneplane_gateway_heartbeat_ack_seconds")] == "histogram"
            assert labelled(figures, "tuneplane_gateway_open_streams") == 1
            assert labelled(figures, "tuneplane_gateway_hellos_total") >= 1
            assert labelled(figures, "tuneplane_node_cpu_percent", node=node.id) is not None
            beats = labelled(figures, "tuneplane_gateway_heartbeats_total")
            later = wait_until(
                lambda: (f := scrape(metrics))
                and labelled(f, "tuneplane_gateway_heartbeats_total") > beats
                and labelled(f, "tuneplane_gateway_lease_flush_seconds_count")
                and f,
                what="heartbeats counted and their leases flushed",
            )
            assert labelled(later, "tuneplane_gateway_heartbeat_ack_seconds_count") >= 1
            assert Node.objects.get(pk=node.pk).card_count == 8

            write(source, {2: {"xid_counts": {"79": 1}}})  # the card falls off the bus
            sick = H100_DEVICES[2]["uuid"]
            wait_until(
                lambda: Node.objects.get(pk=node.pk).card_count == 7, what="the card out of work"
            )
            assert Node.objects.get(pk=node.pk).unhealthy_cards[sick]["reason"] == "XID 79"
            # No new XID: healthy again after the quiet period, by itself.
            wait_until(
                lambda: Node.objects.get(pk=node.pk).card_count == 8,
                timeout=lifted_within,
                what="the card back",
            )
            actions = AuditEvent.objects.filter(target_id=node.id, action__startswith="node.card_")
            assert sorted(actions.values_list("action", flat=True)) == [
                "node.card_healthy",
                "node.card_unhealthy",
            ]

            write(source, {i: {"xid_counts": {"79": 2}} for i in range(8)})
            wait_until(
                lambda: NodeCordon.objects.filter(node=node, source=CordonSource.GPU_HEALTH),
                what="the gpu-health cordon",
            )
            node_cordon(actor=Actor.of_user(admin_user), node=node, reason="reseat the cards")
            wait_until(
                lambda: not NodeCordon.objects.filter(node=node, source=CordonSource.GPU_HEALTH),
                timeout=lifted_within,
                what="the gpu-health cordon lifted",
            )
            assert list(NodeCordon.objects.filter(node=node).values_list("source", flat=True)) == [
                CordonSource.OPERATOR
            ]
        finally:
            agent.send_signal(15)
            agent.wait(20)
    assert "telemetry sample failed" not in agent.output


def test_an_unchanged_sample_is_not_sent_again_a_change_beyond_its_deadband_is(
    tmp_path, console_pki, node_fleet, mint
):
    node, env, _ = lay_out_a_joined_node(node_fleet, mint, tmp_path)
    source = tmp_path / "telemetry.json"
    host = {"cpu_percent": 12.0, "memory_used_bytes": 2**34, "memory_total_bytes": 2**37}
    write(source, host=host)
    metrics = f"127.0.0.1:{free_port()}"
    settings = {
        "TUNEPLANE_GATEWAY_METRICS_BIND": metrics,
        "TUNEPLANE_TELEMETRY_INTERVAL": "1",
        "TUNEPLANE_TELEMETRY_FLUSH_INTERVAL": "1",
    }

    def stored():
        return NodeTelemetry.objects.filter(node=node).first()

    def received() -> float:
        return labelled(
            scrape(metrics), "tuneplane_gateway_telemetry_samples_total", outcome="received"
        )

    with running_gateway(tmp_path, console_pki, **settings) as target:
        agent = serve(
            env, target, tmp_path, "--telemetry-file", str(source), inventory=H100_DEVICE_INVENTORY
        )
        try:
            first = wait_until(stored, what="the stream's first sample").observed_at
            assert stored().host == host
            time.sleep(5)  # five intervals, well inside the refresh period
            assert stored().observed_at == first and received() == 1

            write(source, {2: {"utilization_percent": 47.0}}, host=host)  # 42 %: 5 points
            time.sleep(4)
            assert stored().observed_at == first and received() == 1

            write(source, {2: {"utilization_percent": 70.0}}, host=host)  # 28 points
            row = wait_until(
                lambda: (row := stored()).observed_at > first and row, what="the change sent"
            )
            assert row.cards[2]["utilization_percent"] == 70.0 and received() == 2
        finally:
            agent.send_signal(15)
            agent.wait(20)
    assert "telemetry sample failed" not in agent.output
