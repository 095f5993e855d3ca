"""`make bench`: joins per second on this machine, CSR signing included.

Not a timed test: it prints figures and asserts only that every join succeeded.
"""

import time

import pytest
from django.test import Client

from nodes.models import Node
from nodes.services.join import node_join
from tests.conftest import H100_INVENTORY, make_csr

pytestmark = pytest.mark.bench

JOINS = 200


def _prepared(mint, fleet, count):
    # The node makes its key and CSR; the console's cost starts at the request.
    return [(mint(fleet)[1], make_csr(f"gpu-{i}")[1]) for i in range(count)]


def test_bench_joins_per_second_through_the_service(node_fleet, mint, capsys):
    work = _prepared(mint, node_fleet, JOINS)
    started = time.perf_counter()
    for secret, csr in work:
        node_join(
            token=secret,
            fleet_id="gpu-lab",
            csr=csr,
            inventory=H100_INVENTORY,
            address="10.0.0.1:1",
        )
    elapsed = time.perf_counter() - started
    assert Node.objects.count() == JOINS
    with capsys.disabled():
        print(
            f"\nbench join (service): {JOINS} joins in {elapsed:.2f}s = "
            f"{JOINS / elapsed:.0f} joins/s, {1000 * elapsed / JOINS:.1f} ms each"
        )


def test_bench_joins_per_second_over_http(node_fleet, mint, capsys):
    work = _prepared(mint, node_fleet, JOINS)
    client = Client()
    started = time.perf_counter()
    for secret, csr in work:
        response = client.post(
            "/api/nodes/join",
            {"fleet": "gpu-lab", "token": secret, "csr": csr, "inventory": H100_INVENTORY},
            content_type="application/json",
        )
        assert response.status_code == 201
    elapsed = time.perf_counter() - started
    with capsys.disabled():
        print(
            f"bench join (HTTP, full request path): {JOINS} joins in {elapsed:.2f}s = "
            f"{JOINS / elapsed:.0f} joins/s, {1000 * elapsed / JOINS:.1f} ms each"
        )
