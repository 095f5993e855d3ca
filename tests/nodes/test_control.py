"""Control-stream services: leases renewed in batches (statements independent of N)."""

import subprocess
import sys

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from nodes.choices import SchedulingState
from nodes.models import ControlSession, Node
from nodes.services.control import leases_renew, node_report_inventory
from nodes.services.join import node_join
from nodes.services.sessions import session_open
from tests.conftest import H100_INVENTORY, make_csr
from tests.e2e.console import ROOT


def sessions(fleet, mint, count):
    opened = []
    for _ in range(count):
        result = node_join(
            token=mint(fleet)[1], fleet_id=fleet.id, csr=make_csr()[1], inventory=H100_INVENTORY
        )
        opened.append(
            session_open(node_id=result.node.id, serial=result.certificate.serial, gateway="test")
        )
    return opened


def renew_statements(batch) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert leases_renew(batch) == set(batch)
    return sum(1 for query in queries if query["sql"].startswith("UPDATE"))


def test_lease_renewal_statements_do_not_grow_with_nodes(node_fleet, mint):
    few = sessions(node_fleet, mint, 3)
    many = few + sessions(node_fleet, mint, 30)
    now = timezone.now()
    small = renew_statements({str(s.id): now for s in few})
    large = renew_statements({str(s.id): now for s in many})
    assert small == large == 2
    renewed = ControlSession.objects.get(pk=many[-1].id)
    assert renewed.last_heartbeat_at == now and renewed.lease_expires_at > now


def test_a_closed_session_is_not_renewed(node_fleet, mint):
    from nodes.services.sessions import session_close

    session = sessions(node_fleet, mint, 1)[0]
    session_close(session_id=session.id, reason="stream ended")
    assert leases_renew({str(session.id): timezone.now()}) == set()


def test_first_inventory_on_a_live_session_makes_an_enrolled_node_schedulable(node_fleet, mint):
    session = sessions(node_fleet, mint, 1)[0]
    assert session.node.scheduling_state == SchedulingState.ENROLLED
    node = node_report_inventory(node_id=session.node_id, inventory=H100_INVENTORY)
    assert node.scheduling_state == SchedulingState.SCHEDULABLE


def test_generated_protobuf_modules_are_up_to_date():
    result = subprocess.run(
        [sys.executable, "proto/generate.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_L1_a_beat_saying_the_inventory_is_unchanged_renews_its_observation(node_fleet, mint):
    unchanged, changed = sessions(node_fleet, mint, 2)
    before = {s.node_id: s.node.inventory_observed_at for s in (unchanged, changed)}
    now = timezone.now()
    with CaptureQueriesContext(connection) as queries:
        leases_renew(
            {str(unchanged.id): now, str(changed.id): now}, inventory_fresh={str(unchanged.id)}
        )
    assert sum(1 for q in queries if q["sql"].startswith("UPDATE")) == 2
    observed = dict(Node.objects.values_list("id", "inventory_observed_at"))
    assert observed[unchanged.node_id] == now
    assert observed[changed.node_id] == before[changed.node_id] < now


def test_L1_the_node_row_keeps_its_open_sessions_lease_through_open_renew_replace_close(
    node_fleet, mint
):
    """Admission reads the lease from the node row: it must be the open session's, or none."""
    from nodes.services.sessions import session_close

    def lease_kept(session):
        node = Node.objects.get(pk=session.node_id)
        open_session = ControlSession.objects.filter(node=node, closed_at__isnull=True).first()
        expected = open_session.lease_expires_at if open_session else None
        assert node.lease_expires_at == expected
        return node.lease_expires_at

    first = sessions(node_fleet, mint, 1)[0]
    opened = lease_kept(first)
    assert opened is not None
    later = timezone.now() + timezone.timedelta(seconds=5)
    leases_renew({str(first.id): later})
    assert lease_kept(first) > opened
    credential = first.node.credentials.get()
    second = session_open(node_id=first.node_id, serial=credential.serial, gateway="other")
    assert lease_kept(second) == second.lease_expires_at
    session_close(session_id=second.id, reason="stream ended")
    assert lease_kept(second) is None


def test_a_restarted_gateway_closes_the_sessions_its_killed_process_left_open(node_fleet, mint):
    from nodes.services.control import sessions_left_open_close

    left_open, elsewhere = sessions(node_fleet, mint, 2)
    ControlSession.objects.filter(pk=left_open.pk).update(gateway="gw-1:8443")
    serving_since = timezone.now()
    opened_since = sessions(node_fleet, mint, 1)[0]  # by the new process, before it announced
    ControlSession.objects.filter(pk=opened_since.pk).update(gateway="gw-1:8443")

    assert sessions_left_open_close(gateway="gw-1:8443", serving_since=serving_since) == 1

    closed = dict(ControlSession.objects.values_list("id", "close_reason"))
    assert closed[left_open.id] == "gateway replica restarted"
    assert closed[opened_since.id] == "" and closed[elsewhere.id] == ""
    assert Node.objects.get(pk=left_open.node_id).lease_expires_at is None


def test_L1_sessions_of_a_replica_long_silent_close_once_the_console_has_listened(
    node_fleet, mint, settings
):
    from datetime import timedelta

    from nodes.models import GatewayReplica
    from nodes.services.control import replica_gone_after, sessions_of_silent_replicas_close

    settings.TUNEPLANE_LEASE_TTL = 30
    gone_after = replica_gone_after()
    assert gone_after == timedelta(seconds=150)  # five leases, two minutes at least
    now, second = timezone.now(), timedelta(seconds=1)
    dead, backed_up, beating = sessions(node_fleet, mint, 3)
    for name, silent_for in (
        ("dead", gone_after + second),
        ("backed-up", gone_after - second),
        ("alive", timedelta(0)),
    ):
        GatewayReplica.objects.create(
            name=name, started_at=now - timedelta(hours=1), seen_at=now - silent_for
        )
    for session, gateway in ((dead, "dead"), (backed_up, "backed-up"), (beating, "alive")):
        ControlSession.objects.filter(pk=session.pk).update(
            gateway=gateway, lease_expires_at=now - second
        )

    # Listening for less than that (the database just came back): nothing is judged.
    assert (
        sessions_of_silent_replicas_close(listening_since=now - gone_after + second, now=now) == 0
    )
    assert sessions_of_silent_replicas_close(listening_since=None, now=now) == 0
    assert (
        sessions_of_silent_replicas_close(listening_since=now - gone_after - second, now=now) == 1
    )

    closed = dict(ControlSession.objects.values_list("id", "close_reason"))
    assert closed == {dead.id: "gateway replica silent", backed_up.id: "", beating.id: ""}


def test_the_liveness_sweep_closes_the_sessions_of_a_silent_replica(node_fleet, mint, settings):
    from datetime import timedelta

    from nodes.models import GatewayReplica
    from nodes.services.liveness import liveness_sweep

    settings.TUNEPLANE_LEASE_TTL = 30
    now = timezone.now()
    dead = sessions(node_fleet, mint, 1)[0]
    GatewayReplica.objects.create(
        name="dead", started_at=now - timedelta(hours=1), seen_at=now - timedelta(minutes=5)
    )
    GatewayReplica.objects.create(name="alive", started_at=now - timedelta(hours=1), seen_at=now)
    ControlSession.objects.filter(pk=dead.pk).update(
        gateway="dead", lease_expires_at=now - timedelta(minutes=5)
    )

    liveness_sweep(now=now)

    assert ControlSession.objects.get(pk=dead.pk).closed_at == now
