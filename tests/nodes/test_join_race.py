"""J2: two joins racing for one token — exactly one wins. Real threads, real PostgreSQL."""

import uuid

import pytest
from django.db import connection

from audit.models import AuditEvent
from nodes.models import JoinToken, Node, NodeCredential
from nodes.services.join import JoinRefused, JoinResult, node_join
from tests.conftest import H100_INVENTORY, make_csr
from tests.fleets.test_concurrency import race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RACERS = 50  # the figure: 50 concurrent redemptions of one token


def test_J2_concurrent_redemptions_of_one_token_make_exactly_one_node(make_fleet, mint):
    assert connection.vendor == "postgresql"
    token, secret = mint(make_fleet("gpu-lab"))
    csrs = [make_csr(f"gpu-{i:02}")[1] for i in range(RACERS)]
    results = race(
        lambda i: node_join(
            token=secret,
            fleet_id="gpu-lab",
            csr=csrs[i],
            inventory=H100_INVENTORY,
            address=f"10.0.0.{i}:1",
        ),
        count=RACERS,
    )
    winners = [r for r in results if isinstance(r, JoinResult)]
    refused = [r for r in results if isinstance(r, JoinRefused)]
    assert len(winners) == 1 and len(refused) == RACERS - 1, results
    assert Node.objects.count() == 1 and NodeCredential.objects.count() == 1
    assert JoinToken.objects.get().node_id == winners[0].node.id
    assert AuditEvent.objects.filter(action="node.joined").count() == 1
    # One client, one reason: one audit event a minute (issue 17, item 5).
    refusals = AuditEvent.objects.filter(action="node.join_refused")
    assert [e.after["reason"] for e in refusals] == ["token already used"]


@pytest.mark.redis
def test_join_throttle_holds_under_a_concurrent_burst(require_redis, node_fleet, settings):
    """Forty guesses at once from one address, against the rate of five a minute in Redis:
    exactly five are looked at, thirty-five are refused with 429 — counted, not raced."""
    from rest_framework.test import APIClient

    from tests.nodes.test_join import join_body

    settings.TUNEPLANE_JOIN_RATE = "5/minute"
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": require_redis,
        }
    }
    address = f"2001:db8::{uuid.uuid4().hex[:4]}:1"
    statuses = race(
        lambda i: APIClient()
        .post("/api/nodes/join", join_body("tpj_guess"), format="json", REMOTE_ADDR=address)
        .status_code,
        count=40,
    )
    assert statuses.count(429) == 35 and statuses.count(403) == 5, statuses
