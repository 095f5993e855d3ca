import uuid

import psycopg
import pytest
from django.db import connection

from .console import console_env, database_url, manage

COUNT_FLEETS = "from fleets.models import Fleet; print(Fleet.objects.count())"


@pytest.fixture
def empty_database(tmp_path):
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


@pytest.mark.django_db
def test_F6_migrating_from_zero_creates_no_fleet(empty_database, tmp_path):
    env = console_env(tmp_path, DATABASE_URL=empty_database)
    migrated = manage("migrate", "--noinput", env=env)
    assert migrated.returncode == 0, migrated.stderr
    assert manage("shell", "--no-imports", "-c", COUNT_FLEETS, env=env).stdout.strip() == "0"
    checked = manage("check", env=env)
    assert checked.returncode == 0, checked.stderr
    assert manage("shell", "--no-imports", "-c", COUNT_FLEETS, env=env).stdout.strip() == "0"


def test_migrations_match_the_models(tmp_path):
    result = manage("makemigrations", "--check", "--dry-run", env=console_env(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
