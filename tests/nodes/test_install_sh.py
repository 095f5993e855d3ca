"""install.sh end to end: from the console it came from into a temporary prefix."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import urllib.request
import zipfile

import pytest

from nodes.choices import SchedulingState
from nodes.downloads import build_agent_wheels, build_cli_wheel, lock_sha256, lock_text
from nodes.models import Node
from tests.conftest import H100_INVENTORY

from .agent_process import inventory_file, machine

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="session")
def agent_wheels(tmp_path_factory):
    from django.conf import settings

    settings.TUNEPLANE_DOWNLOADS_DIR = tmp_path_factory.mktemp("downloads")
    result = build_agent_wheels()
    assert result.returncode == 0, result.stderr
    cli = build_cli_wheel()  # beside the agent's, and no part of a node's install
    assert cli.returncode == 0, cli.stderr
    return settings.TUNEPLANE_DOWNLOADS_DIR


@pytest.fixture
def server(live_server, settings, agent_wheels):
    settings.TUNEPLANE_PUBLIC_URL = live_server.url
    settings.TUNEPLANE_DOWNLOADS_DIR = agent_wheels
    return live_server.url


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def run_install(server, env: dict) -> subprocess.CompletedProcess:
    script = fetch(f"{server}/install.sh")
    base = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        "TUNEPLANE_PYTHON": sys.executable,
        # As the one-liner shown at mint carries it.
        "TUNEPLANE_AGENT_SHA256": lock_sha256(),
    }
    return subprocess.run(
        ["sh", "-s"], input=script, env={**base, **env}, capture_output=True, text=True, timeout=300
    )


def test_install_sh_installs_joins_and_configures_but_does_not_start(
    server, node_fleet, mint, tmp_path
):
    prefix = tmp_path / "root"
    _, secret = mint(node_fleet)
    result = run_install(
        server,
        {
            **machine(tmp_path),
            "TUNEPLANE_PREFIX": str(prefix),
            "TUNEPLANE_FLEET": "gpu-lab",
            "TUNEPLANE_JOIN_TOKEN": secret,
            "TUNEPLANE_STORAGE_ROOT": "/mnt/shared",
            "TUNEPLANE_CPU_BUDGET": "32",
            "TUNEPLANE_MEMORY_BUDGET_BYTES": "68719476736",
            "TUNEPLANE_INVENTORY_FILE": inventory_file(tmp_path, H100_INVENTORY),
            "TUNEPLANE_NODE_STATE_DIR": "",
        },
    )
    assert result.returncode == 0, result.stdout + result.stderr
    node = Node.objects.get()
    assert f"as node {node.id}" in result.stdout
    assert "NOT started" in result.stdout and "Enrollment alone does not make" in result.stdout
    assert node.scheduling_state == SchedulingState.ENROLLED

    state = prefix / "var/lib/tuneplane-node"
    assert json.loads((state / "node.json").read_text())["node_id"] == node.id
    conf = (prefix / "etc/tuneplane-node/node.env").read_text()
    for line in (
        f"TUNEPLANE_NODE_STATE_DIR={state}",
        "TUNEPLANE_STORAGE_ROOT=/mnt/shared",
        "TUNEPLANE_CPU_BUDGET=32",
        "TUNEPLANE_MEMORY_BUDGET_BYTES=68719476736",
        "TUNEPLANE_GATEWAY_TARGET=127.0.0.1:8443",
        f"TUNEPLANE_CA_BUNDLE={state}/ca.pem",
    ):
        assert line in conf.splitlines(), line
    unit = (prefix / "etc/systemd/system/tuneplane-node.service").read_text()
    assert f"ExecStart={prefix}/opt/tuneplane-node/bin/tuneplane-node" in unit
    assert "serve --target 127.0.0.1:8443" in unit
    # R6: `systemctl restart tuneplane-node` stops the agent, never its members; systemd's
    # own parser takes the unit without a complaint (a misspelt KillMode is only warned of).
    assert "KillMode=process" in unit.splitlines()
    # D4: an agent the console refused for good exits 3 and is not started again.
    from nodes.agent.serve import EXIT_REFUSED

    assert f"RestartPreventExitStatus={EXIT_REFUSED}" in unit.splitlines()
    if shutil.which("systemd-analyze"):
        verify = subprocess.run(
            [
                "systemd-analyze",
                "verify",
                str(prefix / "etc/systemd/system/tuneplane-node.service"),
            ],
            capture_output=True,
            text=True,
        )
        assert "kill mode" not in verify.stderr.lower(), verify.stderr
    assert secret not in result.stdout + result.stderr + conf + unit

    # The agent's venv has no Django: it is the agent alone.
    python = prefix / "opt/tuneplane-node/bin/python"
    assert subprocess.run([python, "-c", "import django"], capture_output=True).returncode != 0
    help_text = subprocess.run(
        [prefix / "opt/tuneplane-node/bin/tuneplane-node", "--help"], capture_output=True, text=True
    )
    assert help_text.returncode == 0 and "join" in help_text.stdout


def test_install_sh_needs_fleet_and_token(server):
    result = run_install(server, {"TUNEPLANE_PREFIX": "/nonexistent"})
    assert result.returncode != 0 and "TUNEPLANE_FLEET" in result.stderr


def test_downloads_index_lists_the_agent_wheel(server):
    page = fetch(f"{server}/downloads/")
    assert "tuneplane_node-" in page and "cryptography-" in page
    with pytest.raises(urllib.error.HTTPError):
        fetch(f"{server}/downloads/..%2Fsettings.py")


def test_downloads_serve_the_cli_wheel_with_its_sha256_outside_the_agents_lock(
    server, agent_wheels, tmp_path
):
    [wheel] = agent_wheels.glob("tuneplane_cli-*.whl")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert fetch(f"{server}/downloads/tuneplane-cli.sha256") == f"{digest}  {wheel.name}\n"
    page = fetch(f"{server}/downloads/")
    assert f'href="{wheel.name}#sha256={digest}"' in page
    assert "tuneplane_cli" not in lock_text()  # a node installs the agent alone
    with urllib.request.urlopen(f"{server}/downloads/{wheel.name}", timeout=10) as response:
        assert hashlib.sha256(response.read()).hexdigest() == digest
    # pip installs it by its URL, checking the digest; what it installed runs (its
    # dependencies are this venv's here).
    target = tmp_path / "installed"
    installed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--target",
            target,
            f"{server}/downloads/{wheel.name}#sha256={digest}",
        ],
        capture_output=True,
        text=True,
    )
    assert installed.returncode == 0, installed.stderr
    [entry_points] = target.glob("tuneplane_cli-*.dist-info/entry_points.txt")
    assert "tuneplane = tuneplane_cli.main:main" in entry_points.read_text()
    version = subprocess.run(
        [
            sys.executable,
            "-c",
            "import tuneplane_cli.main as m; print(m.__file__); m.main()",
            "--version",
        ],
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
    )
    assert version.stdout.startswith(str(target)), version
    assert "tuneplane, version 0.1.0" in version.stdout


def test_issue17_item15_install_sh_refuses_a_wheel_changed_after_the_one_liner(
    server, settings, agent_wheels, node_fleet, mint, tmp_path
):
    shown = lock_sha256()  # what the one-liner carried
    tampered = tmp_path / "downloads"
    shutil.copytree(agent_wheels, tampered)
    settings.TUNEPLANE_DOWNLOADS_DIR = tampered
    wheel = next(tampered.glob("tuneplane_node-*.whl"))
    with zipfile.ZipFile(wheel, "a") as archive:
        archive.writestr("tuneplane_node/backdoor.py", "print('owned')\n")
    assert "tuneplane_node" in lock_text() and lock_sha256() != shown
    prefix = tmp_path / "root"
    result = run_install(
        server,
        {
            "TUNEPLANE_PREFIX": str(prefix),
            "TUNEPLANE_FLEET": "gpu-lab",
            "TUNEPLANE_JOIN_TOKEN": mint(node_fleet)[1],
            "TUNEPLANE_AGENT_SHA256": shown,
        },
    )
    assert result.returncode != 0
    assert "does not match TUNEPLANE_AGENT_SHA256" in result.stderr
    assert not (prefix / "opt/tuneplane-node").exists() and not Node.objects.exists()
