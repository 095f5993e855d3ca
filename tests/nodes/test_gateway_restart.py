"""A gateway replica restarted after a SIGKILL: the sessions its killed process left open are
closed a lease after the new one starts, not at its start (issue 20), so that a restart under
10,000 nodes does not spend its first seconds closing 10,000 sessions while they reconnect:
a node back within the lease has its own replaced by the batch that opens the new one."""

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from nodes.gateway import loops
from nodes.models import ControlSession, GatewayReplica
from nodes.services.join import node_join
from nodes.services.sessions import session_open
from tests.conftest import H100_INVENTORY, make_csr

pytestmark = pytest.mark.django_db(transaction=True)

LEASE_SECONDS = 2


def left_open(fleet, mint, gateway: str, before) -> ControlSession:
    """A session the replica's killed process opened, its lease run out since."""
    joined = node_join(
        token=mint(fleet)[1], fleet_id=fleet.id, csr=make_csr()[1], inventory=H100_INVENTORY
    )
    session = session_open(
        node_id=joined.node.id, serial=joined.certificate.serial, gateway=gateway
    )
    ControlSession.objects.filter(pk=session.pk).update(
        opened_at=before - timedelta(minutes=1), lease_expires_at=before - timedelta(seconds=1)
    )
    return session


def test_the_sessions_a_killed_replica_left_open_close_a_lease_after_its_start(
    replica, node_fleet, mint, settings
):
    settings.TUNEPLANE_LEASE_TTL = LEASE_SECONDS
    settings.TUNEPLANE_HEARTBEAT_INTERVAL = 1
    session = left_open(node_fleet, mint, replica.name, replica.serving_since)
    seen = {}

    async def scenario():
        started = time.monotonic()
        announcing = asyncio.create_task(loops.announce(replica))
        while not await replica.database.run(announced, replica.name):  # gateway.started
            await asyncio.sleep(0.05)
        seen["open at the start"] = await replica.database.run(is_open, session.pk)
        while await replica.database.run(is_open, session.pk):
            assert time.monotonic() - started < 10 * LEASE_SECONDS, "never closed"
            await asyncio.sleep(0.1)
        seen["closed after"] = time.monotonic() - started
        announcing.cancel()

    with ThreadPoolExecutor(1) as thread:  # a loop of its own, as test_gateway_connect's
        thread.submit(asyncio.run, scenario()).result()

    assert seen["open at the start"]
    assert seen["closed after"] >= LEASE_SECONDS
    session.refresh_from_db()
    assert session.close_reason == "gateway replica restarted"


def announced(name: str) -> bool:
    return GatewayReplica.objects.filter(name=name).exists()


def is_open(pk) -> bool:
    return ControlSession.objects.filter(pk=pk, closed_at__isnull=True).exists()
