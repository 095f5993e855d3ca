"""``tuneplane login`` and where the CLI finds its console: a file only its owner reads, which
TUNEPLANE_SERVER and TUNEPLANE_TOKEN override; a console that cannot be reached is named."""

import ast
import stat
import tomllib
from pathlib import Path

import pytest

from .conftest import closed_port, token_of, tuneplane

pytestmark = pytest.mark.django_db(transaction=True)


def test_login_stores_server_and_token_for_its_owner_only(live_server, member, config_home):
    token = token_of(member)
    result = tuneplane("login", "--server", live_server.url + "/", "--token", token)
    assert result.exit_code == 0, result.output
    path = config_home / "tuneplane" / "config.toml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert tomllib.loads(path.read_text()) == {"server": live_server.url, "token": token}
    # A file there before, readable by others, is made private again.
    path.chmod(0o644)
    assert tuneplane("login", "--server", live_server.url, "--token", token).exit_code == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    listed = tuneplane("get", "fleets")
    assert listed.exit_code == 0 and "CAPABILITIES" in listed.stdout


def test_the_environment_overrides_the_stored_server_and_token(
    live_server, member, config_home, monkeypatch
):
    assert (
        tuneplane("login", "--server", live_server.url, "--token", token_of(member)).exit_code == 0
    )
    monkeypatch.setenv("TUNEPLANE_TOKEN", "not-a-token")
    refused = tuneplane("get", "fleets")
    assert refused.exit_code == 1 and refused.stdout == ""
    assert refused.stderr.startswith("error: ") and "token" in refused.stderr.lower()
    monkeypatch.delenv("TUNEPLANE_TOKEN")
    elsewhere = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("TUNEPLANE_SERVER", elsewhere)
    unreachable = tuneplane("get", "fleets")
    assert unreachable.exit_code == 1
    assert f"Could not reach the console at {elsewhere}" in unreachable.stderr


def test_a_token_the_console_refuses_is_not_stored(live_server, config_home):
    result = tuneplane("login", "--server", live_server.url, "--token", "wrong")
    assert result.exit_code == 1 and "error" in result.stderr
    assert not (config_home / "tuneplane" / "config.toml").exists()


def test_a_network_failure_names_the_server_it_tried(config_home):
    server = f"http://127.0.0.1:{closed_port()}"
    result = tuneplane("login", "--server", server, "--token", "t")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: Could not reach the console at {server}")


def test_without_a_server_the_cli_says_how_to_name_one(config_home):
    result = tuneplane("get", "training-jobs")
    assert result.exit_code == 1 and "tuneplane login --server URL" in result.stderr


def test_the_cli_imports_no_django():
    """It ships on its own (cli/pyproject.toml): nothing of the console, no Django."""
    package = Path(__file__).resolve().parents[2] / "cli" / "tuneplane_cli"
    imported = set()
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                imported.add(node.module.split(".")[0])
    assert imported, "no imports read"
    console = {"django", "rest_framework", "tuneplane", "audit", "fleets", "nodes", "placement"}
    assert not imported & console, imported & console
