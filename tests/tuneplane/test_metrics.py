"""The web's /metrics (issue 19): not public — a bearer token when one is set, otherwise
the client's address (as TUNEPLANE_TRUSTED_PROXIES tells it) in TUNEPLANE_METRICS_ALLOW —
and what it shows: the fleet read at scrape time, admissions and joins counted as they
happen. Scraped from real running processes: tests/e2e/test_metrics.py."""

import ipaddress

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from tests.nodes.test_join import join_body


def scrape(client: Client, **headers) -> dict:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def value(figures: dict, name: str, **labels) -> float:
    return figures.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.mark.django_db
def test_metrics_answer_loopback_and_refuse_any_other_address(settings):
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 403
    # A proxy in front: its own address is loopback, the client is the hop it appended.
    settings.TUNEPLANE_TRUSTED_PROXIES = (ipaddress.ip_network("127.0.0.1/32"),)
    forwarded = Client(REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.9")
    assert forwarded.get("/metrics").status_code == 403


@pytest.mark.django_db
def test_metrics_with_a_token_want_it_from_everyone(settings):
    settings.TUNEPLANE_METRICS_TOKEN = "s3cret-scrape"
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 403
    wrong = Client(REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer nope")
    assert wrong.get("/metrics").status_code == 403
    right = Client(REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer s3cret-scrape")
    assert right.get("/metrics").status_code == 200


def test_the_fleet_and_admissions_as_prometheus_reads_them(
    node_fleet,
    gpu_node,
    member_api,
    anon_api,
):
    node = gpu_node(node_fleet)
    web = Client(REMOTE_ADDR="127.0.0.1")
    before = scrape(web)
    assert value(before, "tuneplane_fleets", kind="node", state="active") == 1
    assert value(before, "tuneplane_nodes", fleet="gpu-lab", state="schedulable") == 1
    assert value(before, "tuneplane_nodes_connected", fleet="gpu-lab") == 1
    assert value(before, "tuneplane_gpu_cards_placeable", fleet="gpu-lab") == 8
    assert value(before, "tuneplane_gpu_cards", fleet="gpu-lab", health="healthy") == 8
    assert value(before, "tuneplane_nodes_quiet", fleet="gpu-lab", capability="train") == 0
    refused = member_api.post(
        "/api/training-jobs", {"project": "ml", "name": "x", "cards": 64, "command": ["true"]}
    )
    assert refused.status_code == 422
    admitted = member_api.post(
        "/api/training-jobs", {"project": "ml", "name": "y", "cards": 1, "command": ["true"]}
    )
    assert admitted.status_code == 201
    assert anon_api.post("/api/nodes/join", join_body("tpj_nope")).status_code == 403
    after = scrape(web)
    for name, labels in [
        ("tuneplane_admissions_total", {"outcome": "refused", "reason": "inventory_fit"}),
        ("tuneplane_admissions_total", {"outcome": "admitted", "reason": ""}),
        ("tuneplane_joins_total", {"outcome": "refused", "reason": "unknown token"}),
    ]:
        assert value(after, name, **labels) == value(before, name, **labels) + 1, (name, labels)
    assert value(after, "tuneplane_admission_seconds_count") >= 2
    assert value(after, "tuneplane_allocator_queue_length", fleet="gpu-lab") == 1
    assert node.card_count == 8
