"""Many new rows of one model in one statement, without quoting each value in Python.

Django's ``bulk_create`` on PostgreSQL binds client-side (psycopg's ``ClientCursor``, Django's
default), so every value of every row is quoted by Python code — text arrays through a regular
expression per element. For the 500 Hellos of one batch, that quoting was 40% of the Python
time of opening their sessions (issue 20), and a gateway's database threads hold the GIL its
event loop needs meanwhile. ``COPY ... FROM STDIN`` hands the rows to psycopg's C writer.
"""

import time

from django.db import connection, models

# Below this many rows, an INSERT is as cheap (COPY costs a second round trip).
COPY_FROM = 10
_GENERATED = (models.AutoField, models.BigAutoField, models.SmallAutoField)
# Fields whose value psycopg takes as Python holds it (an aware datetime, a UUID, text): their
# ``get_db_prep_save`` would only cost Python calls, 30,000 of them for 500 Hellos' rows.
_AS_HELD = (
    models.CharField,
    models.TextField,
    models.BooleanField,
    models.IntegerField,
    models.DateTimeField,
    models.UUIDField,
    models.ForeignKey,
)


def insert(objs: list[models.Model], *, batch_size: int = 5000) -> None:
    """Insert ``objs`` (of one model, none saved yet) as ``bulk_create`` would: COPY on
    PostgreSQL for COPY_FROM rows or more, with the rows ``bulk_create`` writes (each field's
    ``pre_save``, and its database value where psycopg cannot take it as held: JSON, say).
    A primary key the database generates is not read back: such objects keep ``pk`` None."""
    if not objs:
        return
    model = type(objs[0])
    fields = [
        field
        for field in model._meta.concrete_fields
        if not (field.primary_key and isinstance(field, _GENERATED))
    ]
    if (
        connection.vendor != "postgresql"
        or len(objs) < COPY_FROM
        or any(field.has_db_default() for field in fields)  # an expression: COPY cannot take it
    ):
        model.objects.bulk_create(objs, batch_size=batch_size)
        return
    quote = connection.ops.quote_name
    statement = "COPY {} ({}) FROM STDIN".format(
        quote(model._meta.db_table), ", ".join(quote(field.column) for field in fields)
    )
    prepared = [None if isinstance(field, _AS_HELD) else field for field in fields]
    started = time.monotonic()
    with connection.cursor() as cursor, cursor.cursor.copy(statement) as copy:
        for obj in objs:
            values = [field.pre_save(obj, add=True) for field in fields]
            for index, field in enumerate(prepared):
                if field is not None:
                    values[index] = field.get_db_prep_save(values[index], connection)
            copy.write_row(values)
    if connection.queries_logged:  # counted with the rest (CaptureQueriesContext, DEBUG)
        connection.queries_log.append(
            {"sql": f"{statement} -- {len(objs)} rows", "time": f"{time.monotonic() - started:.3f}"}
        )
    for obj in objs:
        obj._state.adding, obj._state.db = False, connection.alias
