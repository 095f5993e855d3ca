import uuid

import psycopg
import pytest
from django.db import connection

from .console import database_url


@pytest.fixture
def empty_database(tmp_path):
    """A database of the suite's vendor that nothing has touched: a fresh machine's."""
    if connection.vendor != "postgresql":
        yield database_url(str(tmp_path / "fresh.sqlite3"))
        return
    name = f"tuneplane_fresh_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(database_url("postgres"), autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield database_url(name)
    finally:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.close()
