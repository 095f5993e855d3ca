"""What a gateway replica tells Prometheus, on its own port (``grpcserve --metrics-bind``).

Counters and histograms are counted where things happen; what a replica holds (its open
streams, its database queue, its nodes' latest telemetry) is read at scrape time by
``GatewayCollector``, so a sample costs nothing more than keeping it.
"""

import sys

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

HELLOS = Counter("tuneplane_gateway_hellos", "Hellos taken (streams opened by nodes).")
HEARTBEATS = Counter("tuneplane_gateway_heartbeats", "Heartbeats taken (leases renewed).")
ACK_LATENCY = Histogram(
    "tuneplane_gateway_heartbeat_ack_seconds",
    "From a heartbeat's arrival to its ack being written to the stream.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
LEASE_FLUSH = Histogram(
    "tuneplane_gateway_lease_flush_seconds", "One batched lease renewal's database write."
)
LEASE_BATCH = Histogram(
    "tuneplane_gateway_lease_flush_batch_size",
    "Sessions renewed by one lease flush.",
    buckets=(1, 10, 100, 1_000, 10_000, 100_000),
)
SESSION_BATCH = Histogram(
    "tuneplane_gateway_session_batch_size",
    "Session opens (Hellos) or closes written by one database call.",
    ["kind"],
    buckets=(1, 2, 5, 10, 50, 100, 500, 1_000),
)
STREAMS_CLOSED = Counter("tuneplane_gateway_streams_closed", "Streams ended, by why.", ["reason"])
OPENS_REFUSED = Counter(
    "tuneplane_gateway_opens_refused",
    "Streams ended before their Welcome, by why: in a reconnect storm, many 'hello timeout' "
    "say TUNEPLANE_HELLO_TIMEOUT is shorter than the gateway takes to read a Hello.",
    ["reason"],
)
TELEMETRY_SAMPLES = Counter(
    "tuneplane_gateway_telemetry_samples",
    "Telemetry samples by what became of them: received; replaced by a newer one of the "
    "same node before a flush; stored; refused as bad.",
    ["outcome"],
)
TELEMETRY_FLUSH = Histogram(
    "tuneplane_gateway_telemetry_flush_seconds", "One batched telemetry write, health included."
)
# Reasons as labels: a few fixed ones, never free text.
CLOSE_REASONS = (
    "stream ended",
    "replaced by a newer stream",
    "lease expired",
    "session closed by the console",
    "too many reports waiting for the database",
)


def close_reason(reason: str) -> str:
    if reason in CLOSE_REASONS:
        return reason
    if reason.startswith("the console could not store"):
        return "store failed"
    return "closed by the console"


CARD_GAUGES = (
    ("utilization_percent", "tuneplane_gpu_utilization_percent", "GPU utilisation."),
    ("memory_used_bytes", "tuneplane_gpu_memory_used_bytes", "GPU memory in use."),
    ("memory_total_bytes", "tuneplane_gpu_memory_total_bytes", "GPU memory in all."),
    ("temperature_celsius", "tuneplane_gpu_temperature_celsius", "GPU temperature."),
    ("power_watts", "tuneplane_gpu_power_watts", "GPU power draw."),
)
HOST_GAUGES = (
    ("cpu_percent", "tuneplane_node_cpu_percent", "The node's CPU use, all CPUs."),
    ("memory_used_bytes", "tuneplane_node_memory_used_bytes", "The node's memory in use."),
    ("memory_total_bytes", "tuneplane_node_memory_total_bytes", "The node's memory in all."),
)


class GatewayCollector:
    """Read at scrape time from one replica: its streams, its database queue, and the latest
    telemetry sample of each node whose stream it holds (labelled by node and card)."""

    def __init__(self, gateway):
        self.gateway = gateway

    def collect(self):
        gateway = self.gateway
        yield GaugeMetricFamily(
            "tuneplane_gateway_open_streams",
            "Node streams this replica holds.",
            value=len(gateway.streams.by_node),
        )
        yield GaugeMetricFamily(
            "tuneplane_gateway_python_allocated_blocks",
            "Memory blocks Python's allocator holds (sys.getallocatedblocks): RSS that grows "
            "while this does not is native memory (grpc's, the C allocator's), not objects kept.",
            value=sys.getallocatedblocks(),
        )
        yield GaugeMetricFamily(
            "tuneplane_gateway_database_queue_depth",
            "Database work waiting for this replica's threads.",
            value=gateway.database.waiting(),
        )
        latest = dict(gateway.telemetry.latest)
        card_labels = ["node", "card", "uuid", "name"]
        cards = {
            key: GaugeMetricFamily(name, doc, labels=card_labels) for key, name, doc in CARD_GAUGES
        }
        ecc = CounterMetricFamily(
            "tuneplane_gpu_ecc_errors",
            "Volatile ECC errors the driver counted, by type.",
            labels=[*card_labels, "type"],
        )
        xids = CounterMetricFamily(
            "tuneplane_gpu_xid_events",
            "XID events the agent saw since it started, by XID.",
            labels=[*card_labels, "xid"],
        )
        hosts = {
            key: GaugeMetricFamily(name, doc, labels=["node"]) for key, name, doc in HOST_GAUGES
        }
        age = GaugeMetricFamily(
            "tuneplane_node_telemetry_timestamp_seconds",
            "When this replica received the node's latest sample (Unix time).",
            labels=["node"],
        )
        for node_id, (at, sample) in latest.items():
            age.add_metric([node_id], at)
            for key, family in hosts.items():
                family.add_metric([node_id], sample["host"][key])
            for card in sample["cards"]:
                labels = [node_id, str(card["index"]), card["uuid"], card["name"]]
                for key, family in cards.items():
                    family.add_metric(labels, card[key])
                ecc.add_metric([*labels, "corrected"], card["ecc_corrected"])
                ecc.add_metric([*labels, "uncorrected"], card["ecc_uncorrected"])
                for code, count in card["xid_counts"].items():
                    xids.add_metric([*labels, code], count)
        yield from cards.values()
        yield from hosts.values()
        yield from (ecc, xids, age)
