"""`tuneplane-node join` and `status` against a live console (J2–J5)."""

import json
import stat
from pathlib import Path

import pytest
from django.utils import timezone

from audit.services import Actor
from nodes.models import Node
from nodes.services.join import join_token_revoke
from tests.conftest import H100_INVENTORY

from .agent_process import agent, inventory_file, machine

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def server(live_server, settings):
    settings.TUNEPLANE_PUBLIC_URL = live_server.url
    settings.TUNEPLANE_GATEWAY_TARGET = "127.0.0.1:8443"
    return live_server.url


def join(server, secret, env, tmp_path, inventory=H100_INVENTORY, *extra):
    return agent(
        "join",
        "--server",
        server,
        "--fleet",
        "gpu-lab",
        "--token",
        secret,
        "--inventory-file",
        inventory_file(tmp_path, inventory),
        *extra,
        env=env,
    )


def test_join_writes_private_state_and_prints_the_next_step(server, node_fleet, mint, tmp_path):
    env = machine(tmp_path)
    _, secret = mint(node_fleet)
    result = join(server, secret, env, tmp_path, H100_INVENTORY, "--address", "10.1.2.3:9100")
    assert result.returncode == 0, result.stderr
    node = Node.objects.get()
    assert f"Joined fleet gpu-lab as node {node.id}." in result.stdout
    assert "Next: tuneplane-node serve --target 127.0.0.1:8443" in result.stdout
    assert node.address == "10.1.2.3:9100" and node.fingerprint

    state = Path(env["TUNEPLANE_NODE_STATE_DIR"])
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for name in ("node.json", "node.key", "node.crt", "ca.pem"):
        assert stat.S_IMODE((state / name).stat().st_mode) == 0o600, name
    identity = json.loads((state / "node.json").read_text())
    assert identity["node_id"] == node.id and identity["fleet"] == "gpu-lab"
    key = (state / "node.key").read_text()
    assert "PRIVATE KEY" in key
    # The key never left the machine: nothing the console stored or logged holds it.
    assert key.splitlines()[1] not in json.dumps(list(Node.objects.values()), default=str)

    status = agent("status", env=env)
    assert status.returncode == 0
    assert node.id in status.stdout and "gpu-lab" in status.stdout and "expires" in status.stdout


def test_unknown_card_and_address_warnings_are_printed(server, node_fleet, mint, tmp_path):
    first = join(
        server,
        mint(node_fleet)[1],
        machine(tmp_path, "a"),
        tmp_path,
        H100_INVENTORY,
        "--address",
        "10.9.9.9:9100",
    )
    assert first.returncode == 0, first.stderr
    card = {**H100_INVENTORY, "cards": [{"name": "Mystery Accelerator X", "count": 4}]}
    second = join(
        server,
        mint(node_fleet)[1],
        machine(tmp_path, "b"),
        tmp_path,
        card,
        "--address",
        "10.9.9.9:9100",
    )
    assert second.returncode == 0, second.stderr
    old = Node.objects.order_by("created_at").first()
    assert (
        f"warning: address_in_use: Another node ({old.id}) answers at 10.9.9.9:9100"
        in second.stdout
    )
    assert "warning: unknown_card: Card 'Mystery Accelerator X'" in second.stdout


def test_a_used_or_revoked_token_exits_non_zero_with_one_line(
    server, node_fleet, mint, admin_user, tmp_path
):
    _, secret = mint(node_fleet)
    assert join(server, secret, machine(tmp_path, "a"), tmp_path).returncode == 0
    again = join(server, secret, machine(tmp_path, "b"), tmp_path)
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr.count("\n") == 1 and "Join refused" in again.stderr
    token, revoked = mint(node_fleet)
    join_token_revoke(actor=Actor.of_user(admin_user), token=token)
    assert join(server, revoked, machine(tmp_path, "c"), tmp_path).returncode == 1
    assert Node.objects.count() == 1


def test_an_expired_token_is_refused(server, node_fleet, mint, tmp_path):
    token, secret = mint(node_fleet)
    token.expires_at = timezone.now()  # the clock has moved past its 24 hours
    token.save(update_fields=["expires_at"])
    result = join(server, secret, machine(tmp_path), tmp_path)
    assert result.returncode == 1 and "Join refused" in result.stderr
    assert not Node.objects.exists()


def test_a_joined_machine_does_not_join_twice_from_one_state_dir(
    server, node_fleet, mint, tmp_path
):
    env = machine(tmp_path)
    assert join(server, mint(node_fleet)[1], env, tmp_path).returncode == 0
    again = join(server, mint(node_fleet)[1], env, tmp_path)
    assert again.returncode == 1 and "already holds node" in again.stderr
    assert Node.objects.count() == 1


def test_plain_http_is_refused_except_to_loopback(tmp_path):
    result = agent(
        "join",
        "--server",
        "http://console.example.com",
        "--fleet",
        "gpu-lab",
        "--token",
        "tpj_x",
        env=machine(tmp_path),
    )
    assert result.returncode == 1 and "plain http" in result.stderr


def test_token_may_come_from_the_environment(server, node_fleet, mint, tmp_path):
    env = {**machine(tmp_path), "TUNEPLANE_JOIN_TOKEN": mint(node_fleet)[1]}
    result = agent(
        "join",
        "--server",
        server,
        "--fleet",
        "gpu-lab",
        "--inventory-file",
        inventory_file(tmp_path, H100_INVENTORY),
        env=env,
    )
    assert result.returncode == 0, result.stderr


def test_status_before_joining_says_so(tmp_path):
    result = agent("status", env=machine(tmp_path))
    assert result.returncode == 1 and "not joined" in result.stdout
