"""J2: two joins racing for one token — exactly one wins. Real threads, real PostgreSQL."""

import pytest
from django.db import connection

from audit.models import AuditEvent
from nodes.models import JoinToken, Node, NodeCredential
from nodes.services import JoinRefused, JoinResult, node_join
from tests.conftest import H100_INVENTORY, make_csr
from tests.fleets.test_concurrency import race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RACERS = 50  # the figure: 50 concurrent redemptions of one token


def test_J2_concurrent_redemptions_of_one_token_make_exactly_one_node(make_fleet, mint):
    assert connection.vendor == "postgresql"
    token, secret = mint(make_fleet("gpu-lab"))
    csrs = [make_csr(f"gpu-{i:02}")[1] for i in range(RACERS)]
    results = race(lambda i: node_join(token=secret, fleet_id="gpu-lab", csr=csrs[i],
                                       inventory=H100_INVENTORY, address=f"10.0.0.{i}:1"),
                   count=RACERS)
    winners = [r for r in results if isinstance(r, JoinResult)]
    refused = [r for r in results if isinstance(r, JoinRefused)]
    assert len(winners) == 1 and len(refused) == RACERS - 1, results
    assert Node.objects.count() == 1 and NodeCredential.objects.count() == 1
    assert JoinToken.objects.get().node_id == winners[0].node.id
    assert AuditEvent.objects.filter(action="node.joined").count() == 1
    assert AuditEvent.objects.filter(action="node.join_refused").count() == RACERS - 1
    assert {e.after["reason"] for e in AuditEvent.objects.filter(
        action="node.join_refused")} == {"token already used"}
