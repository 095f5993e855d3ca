import signal
import uuid

import psycopg
import pytest
from django.db import connection

from nodes.models import ControlSession

from .agents import lay_out_a_joined_node, running_gateway, serve, wait_until
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


@pytest.fixture
def gateway(tmp_path, console_pki):
    with running_gateway(tmp_path, console_pki) as target:
        yield target


@pytest.fixture
def gateway_short_credentials(tmp_path, console_pki):
    with running_gateway(tmp_path, console_pki, TUNEPLANE_NODE_CREDENTIAL_TTL="6") as target:
        yield target


@pytest.fixture
def joined(node_fleet, mint, tmp_path):
    return lay_out_a_joined_node(node_fleet, mint, tmp_path)


@pytest.fixture
def joined_short(node_fleet, mint, tmp_path, settings):
    settings.TUNEPLANE_NODE_CREDENTIAL_TTL = 6
    return lay_out_a_joined_node(node_fleet, mint, tmp_path)


@pytest.fixture
def bystander(gateway, node_fleet, mint, tmp_path):
    """A real agent on its own node, holding its stream throughout."""
    node, env, _ = lay_out_a_joined_node(node_fleet, mint, tmp_path, name="bystander")
    agent = serve(env, gateway, tmp_path)
    session = wait_until(
        lambda: ControlSession.objects.filter(node=node, closed_at__isnull=True).first(),
        what="the bystander connected",
    )
    yield session
    agent.send_signal(signal.SIGTERM)
    agent.wait(20)
