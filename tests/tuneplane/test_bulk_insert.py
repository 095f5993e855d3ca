"""tuneplane.bulk_insert: many rows by COPY on PostgreSQL, the rows ``bulk_create`` would write
(issue 20: a gateway's batch of Hellos, its sessions and their audit events)."""

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Q
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.models import AuditEvent
from nodes.models import ControlSession, Node
from tuneplane import bulk_insert

pytestmark = pytest.mark.django_db


NOW = timezone.now()


def events(tag: str, count: int, now=NOW) -> list[AuditEvent]:
    return [
        AuditEvent(
            at=now - timedelta(seconds=index),
            actor_type="node",
            actor_id=f"n-{index}",
            actor_label=f"node «{index}»\t'quoted'\n",  # what COPY's text format must escape
            action=f"{tag}.done",
            target_type="nodes.controlsession",
            target_id=str(index),
            before=None if index % 2 else {"open": True, "nested": [1, "two", None]},
            after={"reason": 'a \\ backslash and "quotes"', "n": index},
            correlation_id=tag,
        )
        for index in range(count)
    ]


def rows(tag: str) -> list[tuple]:
    """The events written under ``tag``, every column but the id and the two ``tag`` names."""
    named = {"id", "action", "correlation_id"}
    columns = [f.attname for f in AuditEvent._meta.concrete_fields if f.attname not in named]
    return list(
        AuditEvent.objects.filter(correlation_id=tag).order_by("target_id").values_list(*columns)
    )


@pytest.mark.postgres
def test_copy_writes_what_bulk_create_writes():
    """A1: the audit events a batch writes by COPY are the events bulk_create wrote."""
    count = bulk_insert.COPY_FROM + 5
    AuditEvent.objects.bulk_create(events("orm", count))
    with CaptureQueriesContext(connection) as queries:
        copied = events("copy", count)
        bulk_insert.insert(copied)
    # One COPY, counted with the other statements; no INSERT through Django's quoting.
    assert [q["sql"].split(" (")[0] for q in queries.captured_queries] == [
        'COPY "audit_auditevent"'
    ]
    by_orm, by_copy = rows("orm"), rows("copy")
    assert len(by_copy) == count
    assert by_copy == by_orm
    # JSON None is SQL NULL, as the JSONField writes it, not the JSON null.
    assert (
        AuditEvent.objects.filter(correlation_id="copy", before__isnull=True).count() == count // 2
    )
    assert all(not obj._state.adding for obj in copied)


@pytest.mark.postgres
def test_copied_rows_keep_the_keys_made_in_python(node_fleet):
    node = Node.objects.create(id="n-copy", fleet=node_fleet, hostname="copy-01")
    now = timezone.now()
    sessions = [
        ControlSession(
            node=node,
            gateway=f"gw-{index}",
            opened_at=now,
            last_heartbeat_at=now,
            lease_expires_at=now + timedelta(seconds=30),
            closed_at=now,
        )
        for index in range(bulk_insert.COPY_FROM)
    ]
    bulk_insert.insert(sessions)
    stored = ControlSession.objects.in_bulk([s.pk for s in sessions])
    assert len(stored) == len(sessions)
    assert {s.gateway for s in stored.values()} == {s.gateway for s in sessions}
    assert ControlSession.objects.filter(Q(close_reason="") & Q(agent_version="")).count() == len(
        sessions
    )


def test_few_rows_and_sqlite_go_through_bulk_create(monkeypatch):
    calls = []
    monkeypatch.setattr(
        AuditEvent.objects, "bulk_create", lambda objs, **kw: calls.append(len(objs))
    )
    bulk_insert.insert(events("few", bulk_insert.COPY_FROM - 1))
    many = bulk_insert.COPY_FROM if connection.vendor != "postgresql" else 0
    if many:
        bulk_insert.insert(events("many", many))
    assert calls == [bulk_insert.COPY_FROM - 1, *([many] if many else [])]


@pytest.mark.postgres
def test_a_database_default_goes_through_bulk_create(monkeypatch):
    """A db_default is an expression, which COPY cannot carry."""
    calls = []
    monkeypatch.setattr(AuditEvent._meta.get_field("forced"), "has_db_default", lambda: True)
    monkeypatch.setattr(
        AuditEvent.objects, "bulk_create", lambda objs, **kw: calls.append(len(objs))
    )
    bulk_insert.insert(events("default", bulk_insert.COPY_FROM))
    assert calls == [bulk_insert.COPY_FROM]
