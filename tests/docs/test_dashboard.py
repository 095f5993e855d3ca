"""The Grafana dashboard (deploy/grafana/tuneplane.json) queries only what the console
exports: every metric name in its queries is a series the web's /metrics (scraped here with
Django's test client from loopback, with a Fleet, a node, a cordon, a queued job and quotas
present) or a gateway's /metrics (its registry and its GatewayCollector holding a stream and
a node's telemetry) serves. The alerting rules in docs/operator/metrics.md are held the same
way."""

import json
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.test import Client
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from audit.services import Actor
from nodes.gateway import memory  # noqa: F401  (registers the gateway's memory figures)
from nodes.gateway.metrics import GatewayCollector
from nodes.services.cordons import node_cordon
from placement.services.quotas import QuotaSpec, quotas_replace

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "tuneplane.json"
METRICS_PAGE = ROOT / "docs" / "operator" / "metrics.md"
METRIC = re.compile(r"\btuneplane_[a-z0-9_]+\b")
# What the issue asks the dashboard to show, by the series that show it.
REQUIRED = {
    "tuneplane_fleets",  # Fleet counts by state
    "tuneplane_nodes",  # node counts by Fleet and state
    "tuneplane_gateway_open_streams",  # streams per gateway replica
    "tuneplane_gateway_heartbeat_ack_seconds_bucket",  # ack latency
    "tuneplane_admissions_total",  # admissions and refusals by reason
    "tuneplane_allocator_queue_length",  # queue length
    "tuneplane_waiting",  # waiting reasons (Q8)
    "tuneplane_gpu_cards_series",  # cards held and free by series
    "tuneplane_quota_in_use",
    "tuneplane_quota_borrowed",
    "tuneplane_quota_queued",
    "tuneplane_quota_guaranteed",
    "tuneplane_quota_limit",
    "tuneplane_quota_fair_share",
    "tuneplane_gpu_cards_placeable",  # cards free
    "tuneplane_gpu_cards",  # cards by health
    "tuneplane_gpu_utilization_percent",  # per-card utilisation
    "tuneplane_gpu_ecc_errors_total",  # per-card health
    "tuneplane_gpu_xid_events_total",
}


def series_names(exposition: str) -> set[str]:
    """The series names a Prometheus scrape of this text stores: each sample's name, and for
    a family with no sample yet the names its type gives it (a counter's _total, ...)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
    names = set()
    for family in text_string_to_metric_families(exposition):
        names |= {sample.name for sample in family.samples}
        names |= {family.name + suffix for suffix in suffixes.get(family.type, ("",))}
    return names


def queried(dashboard: dict) -> set[str]:
    """Every metric name in the dashboard's queries: its panels' and its variables'."""
    names: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in {"expr", "query"} and isinstance(value, str):
                    names.update(METRIC.findall(value))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(dashboard)
    return names


def unknown(dashboard: dict, exported: set[str]) -> list[str]:
    return sorted(queried(dashboard) - exported)


def gateway_holding_a_node() -> SimpleNamespace:
    """What GatewayCollector reads of a replica: its streams, its database queue, and its
    nodes' latest telemetry, one node with one card that saw an XID."""
    card = {
        "index": 0,
        "uuid": "GPU-0000",
        "name": "NVIDIA H100 80GB HBM3",
        "utilization_percent": 97.0,
        "memory_used_bytes": 70 << 30,
        "memory_total_bytes": 80 << 30,
        "temperature_celsius": 61.0,
        "power_watts": 540.0,
        "ecc_corrected": 1,
        "ecc_uncorrected": 0,
        "xid_counts": {"79": 1},
    }
    host = {"cpu_percent": 40.0, "memory_used_bytes": 1 << 30, "memory_total_bytes": 4 << 30}
    return SimpleNamespace(
        streams=SimpleNamespace(by_node={"gpu-01": object()}),
        database=SimpleNamespace(waiting=lambda: 0),
        telemetry=SimpleNamespace(
            latest={"gpu-01": (time.time(), {"cards": [card], "host": host})}
        ),
    )


@pytest.fixture
def exported(node_fleet, gpu_node, project, member_api):
    """The series the web's and a gateway's /metrics serve, with data present."""
    node = gpu_node(node_fleet)
    node_cordon(actor=Actor.system("docs"), node=node, reason="disk")
    quotas_replace(
        actor=Actor.system("docs"),
        fleet=node_fleet,
        specs=[QuotaSpec(project=project.slug, guaranteed=2, limit=8)],
    )
    member_api.post(
        "/api/training-jobs", {"project": "ml", "name": "big", "cards": 64, "command": ["true"]}
    )  # refused: an admission counted with its reason
    member_api.post(
        "/api/training-jobs", {"project": "ml", "name": "q", "cards": 1, "command": ["true"]}
    )  # admitted and queued
    web = Client(REMOTE_ADDR="127.0.0.1").get("/metrics")
    assert web.status_code == 200
    gateway = CollectorRegistry()
    gateway.register(GatewayCollector(gateway_holding_a_node()))
    exposition = (
        web.content.decode()
        + generate_latest(REGISTRY).decode()  # the gateway process's own registry
        + generate_latest(gateway).decode()
    )
    names = series_names(exposition)
    assert {"tuneplane_nodes", "tuneplane_gpu_xid_events_total"} <= names
    return names


def test_every_metric_the_dashboard_queries_is_exported(exported):
    dashboard = json.loads(DASHBOARD.read_text())
    assert unknown(dashboard, exported) == []
    assert not REQUIRED - queried(dashboard), "the dashboard misses what it must show"


def test_every_metric_the_documented_alerts_query_is_exported(exported):
    rules = re.findall(r"expr: (.+)", METRICS_PAGE.read_text())
    assert rules
    assert sorted({name for rule in rules for name in METRIC.findall(rule)} - exported) == []


def test_a_metric_nobody_exports_is_caught(exported):
    dashboard = json.loads(DASHBOARD.read_text())
    dashboard["panels"].append({"targets": [{"expr": "sum(tuneplane_fleets_by_state)"}]})
    dashboard["templating"]["list"].append({"query": {"query": "label_values(tuneplane_x, a)"}})
    assert unknown(dashboard, exported) == ["tuneplane_fleets_by_state", "tuneplane_x"]
    # A counter's family name is no series of its own: only its _total is.
    assert "tuneplane_admissions" not in exported
