"""The web's /metrics (issue 19): answered for configured scrapers only (R23) — a request
bearing TUNEPLANE_METRICS_TOKEN, or one whose client address (as TUNEPLANE_TRUSTED_PROXIES
tells it) is in TUNEPLANE_METRICS_ALLOW; with neither, nobody — a gateway's and a worker's
metrics port alike; and what it shows: the fleet read at scrape time, admissions and joins
counted as they happen. Scraped from real running processes: tests/e2e/test_metrics.py."""

import ipaddress
import socket
import urllib.error
import urllib.request

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from tests.docs.reference_hook import load
from tests.nodes.test_join import join_body
from tuneplane.client_address import parse_trusted_proxies
from tuneplane.metrics import scraper_allowed, serve_metrics_on


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


LOOPBACK = parse_trusted_proxies("127.0.0.1,::1")


def test_R23_a_scraper_is_its_token_or_an_allowed_address_and_nothing_else():
    allowed = parse_trusted_proxies("10.1.2.0/24")
    assert scraper_allowed("", "10.1.2.3", token="", allow=allowed)
    assert not scraper_allowed("", "10.1.3.1", token="", allow=allowed)
    assert scraper_allowed("Bearer s3cret", "203.0.113.9", token="s3cret", allow=())
    for wrong in ("", "Bearer ", "Bearer s3cre", "Bearer s3cret ", "s3cret", "Basic s3cret"):
        assert not scraper_allowed(wrong, "203.0.113.9", token="s3cret", allow=())
    # Nothing configured: nobody, loopback (a member on the console's machine) included; an
    # empty token is no token, whatever the header says.
    for address in ("127.0.0.1", "::1", "10.1.2.3", "not an address", ""):
        assert not scraper_allowed("Bearer ", address, token="", allow=())


def test_R23_by_default_metrics_have_no_scraper_and_debug_is_off():
    """The code's own defaults, as the settings reference reads them."""
    defaults = {setting.env: setting.default for setting in load().read_settings()}
    assert defaults["TUNEPLANE_METRICS_ALLOW"] == defaults["TUNEPLANE_METRICS_TOKEN"] == ""
    assert defaults["TUNEPLANE_DEBUG"] is False


@pytest.mark.django_db
def test_R23_metrics_configured_for_nobody_answer_nobody_not_even_loopback(settings):
    settings.TUNEPLANE_METRICS_TOKEN, settings.TUNEPLANE_METRICS_ALLOW = "", ()
    for address in ("127.0.0.1", "::1", "10.1.2.3"):
        assert Client(REMOTE_ADDR=address).get("/metrics").status_code == 403


@pytest.mark.django_db
def test_R23_metrics_answer_the_allowed_addresses_only(settings):
    settings.TUNEPLANE_METRICS_ALLOW = parse_trusted_proxies("10.1.2.3")
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 403
    assert Client(REMOTE_ADDR="10.1.2.4").get("/metrics").status_code == 403
    # A proxy in front: its own address is not the client; the hop it appended is.
    settings.TUNEPLANE_METRICS_ALLOW = LOOPBACK
    settings.TUNEPLANE_TRUSTED_PROXIES = (ipaddress.ip_network("127.0.0.1/32"),)
    forwarded = Client(REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.9")
    assert forwarded.get("/metrics").status_code == 403


@pytest.mark.django_db
def test_R23_metrics_with_a_token_answer_it_from_anywhere(settings):
    settings.TUNEPLANE_METRICS_TOKEN, settings.TUNEPLANE_METRICS_ALLOW = "s3cret-scrape", ()
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 403
    wrong = Client(REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer nope")
    assert wrong.get("/metrics").status_code == 403
    right = Client(REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer s3cret-scrape")
    assert right.get("/metrics").status_code == 200


@pytest.mark.django_db
def test_R23_a_gateways_and_a_workers_metrics_port_answers_configured_scrapers_only(settings):
    settings.TUNEPLANE_METRICS_TOKEN, settings.TUNEPLANE_METRICS_ALLOW = "s3cret-scrape", ()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = serve_metrics_on(f"127.0.0.1:{port}")
    try:

        def status(**headers) -> int:
            request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    return response.status
            except urllib.error.HTTPError as refused:
                return refused.code

        assert status() == 403  # loopback is no credential
        assert status(Authorization="Bearer nope") == 403
        assert status(Authorization="Bearer s3cret-scrape") == 200
        settings.TUNEPLANE_METRICS_ALLOW = LOOPBACK
        assert status() == 200  # the address allowed
    finally:
        server.shutdown()
        server.server_close()


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
