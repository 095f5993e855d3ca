"""`make bench`: an enrolled node reporting 12,000 distinct command ids the console never
gave it (issue 17 item 11): half in Hellos of 1,000 (the Hello cap), half one CommandUpdate
each. Prints the stray rows kept, the audit rows written and the database time spent."""

import os
import time

import pytest
from django.db import connection

from audit.models import AuditEvent
from nodes.models import StrayCommand
from nodes.services.commands import Reported, node_command_report, node_commands_reconcile
from nodes.services.join import node_join
from tests.conftest import H100_INVENTORY, make_csr

pytestmark = [pytest.mark.bench, pytest.mark.postgres]

HELLOS, PER_HELLO, UPDATES = 6, 1_000, 6_000


class _DatabaseTime:
    def __init__(self):
        self.seconds, self.queries, self.by_kind = 0.0, 0, {}

    def __call__(self, execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            took = time.perf_counter() - started
            self.seconds += took
            self.queries += 1
            kind = " ".join(sql.split()[:3])[:60]
            self.by_kind[kind] = self.by_kind.get(kind, 0.0) + took


# Each report commits, as it does from the gateway: one long test transaction would keep every
# dead row version of the node and its strays in the way of the next statement.
@pytest.mark.django_db(transaction=True)
def test_bench_strays(node_fleet, mint, capsys):
    node = node_join(
        token=mint(node_fleet)[1], fleet_id="gpu-lab", csr=make_csr()[1], inventory=H100_INVENTORY
    ).node
    audited = AuditEvent.objects.count()
    database = _DatabaseTime()
    started = time.perf_counter()
    with connection.execute_wrapper(database):
        for hello in range(HELLOS):
            report = [Reported(f"c-h{hello}-{i}", "running") for i in range(PER_HELLO)]
            node_commands_reconcile(node_id=node.id, reported=report)
        for i in range(UPDATES):
            node_command_report(node_id=node.id, reported=Reported(f"c-u{i}", "running"))
    wall = time.perf_counter() - started
    node.refresh_from_db()
    with capsys.disabled():
        print(
            f"\nbench strays, {HELLOS * PER_HELLO + UPDATES:,} unknown ids "
            f"({HELLOS} Hellos of {PER_HELLO:,}, {UPDATES:,} CommandUpdates): "
            f"stray rows kept {StrayCommand.objects.filter(node=node).count():,}, "
            f"dropped {getattr(node, 'strays_dropped', 0):,}, "
            f"audit rows written {AuditEvent.objects.count() - audited:,}, "
            f"database {database.seconds:.2f} s in {database.queries:,} queries "
            f"({wall:.2f} s wall)"
        )
        if os.environ.get("TUNEPLANE_BENCH_VERBOSE"):
            for kind, seconds in sorted(database.by_kind.items(), key=lambda kv: -kv[1])[:8]:
                print(f"  {seconds:6.2f} s  {kind}")
