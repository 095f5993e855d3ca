"""Audit events are never edited or deleted, below the ORM too (A1)."""

from django.db import migrations

TABLE = "audit_auditevent"

POSTGRES_FORWARD = f"""
CREATE FUNCTION audit_event_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit events are append-only: % refused', TG_OP;
END;
$$;
CREATE TRIGGER audit_event_append_only BEFORE UPDATE OR DELETE ON {TABLE}
    FOR EACH ROW EXECUTE FUNCTION audit_event_append_only();
"""
POSTGRES_BACKWARD = f"""
DROP TRIGGER audit_event_append_only ON {TABLE};
DROP FUNCTION audit_event_append_only();
"""
# SQLite (the embedded default) refuses UPDATE only: Django empties an SQLite table with
# DELETE (`manage.py flush`, the test runner), where PostgreSQL uses TRUNCATE. The ORM
# refuses deletes on both.
SQLITE_FORWARD = [
    f"""CREATE TRIGGER audit_event_no_update BEFORE UPDATE ON {TABLE}
        BEGIN SELECT RAISE(ABORT, 'audit events are append-only: UPDATE refused'); END;"""
]
SQLITE_BACKWARD = ["DROP TRIGGER audit_event_no_update;"]


def forward(apps, schema_editor):
    statements = (POSTGRES_FORWARD,) if schema_editor.connection.vendor == "postgresql" \
        else SQLITE_FORWARD if schema_editor.connection.vendor == "sqlite" else ()
    for statement in statements:
        schema_editor.execute(statement, params=None)


def backward(apps, schema_editor):
    statements = (POSTGRES_BACKWARD,) if schema_editor.connection.vendor == "postgresql" \
        else SQLITE_BACKWARD if schema_editor.connection.vendor == "sqlite" else ()
    for statement in statements:
        schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]
    operations = [migrations.RunPython(forward, backward)]
