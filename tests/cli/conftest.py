"""The command line against a live console: pytest-django's live server (real HTTP, the test
database), the CLI run in-process by click's runner, its configuration in a temporary
XDG_CONFIG_HOME and no TUNEPLANE_SERVER or TUNEPLANE_TOKEN but what a test sets."""

import socket

import pytest
from click.testing import CliRunner
from tuneplane_cli.main import cli

from tests.conftest import SYSTEM
from tuneplane.services import api_token_create


@pytest.fixture(autouse=True)
def config_home(tmp_path, monkeypatch):
    home = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    monkeypatch.delenv("TUNEPLANE_SERVER", raising=False)
    monkeypatch.delenv("TUNEPLANE_TOKEN", raising=False)
    return home


def token_of(user) -> str:
    return api_token_create(actor=SYSTEM, user=user)[1]


@pytest.fixture
def signed_in(live_server, monkeypatch):
    """The CLI as ``user``: the console's URL and a token of theirs in the environment."""

    def sign_in(user):
        monkeypatch.setenv("TUNEPLANE_SERVER", live_server.url)
        monkeypatch.setenv("TUNEPLANE_TOKEN", token_of(user))

    return sign_in


def tuneplane(*args):
    """``tuneplane ARGS`` in-process: its exit code, stdout and stderr."""
    return CliRunner().invoke(cli, [str(arg) for arg in args], catch_exceptions=False)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
