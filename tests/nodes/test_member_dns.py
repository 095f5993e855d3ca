"""A confined member resolves names through a server it can reach (R19), on a real root
agent's runner under runc: a name server on another machine (a namespace behind a veth,
tests/nodes/test_network.py's ``outside``) answers the member's lookup although the node's
own resolv.conf names its loopback stub first; the member's hosts file names it at its own
address. What the member's files say is decided in tests/nodes/test_resolver.py."""

import subprocess
import sys
import time

import pytest

from nodes.agent.member import network, resolver
from tests.attacks.conftest import image_node, node  # noqa: F401 (fixtures: a root agent's)
from tests.dockerd import IMAGE
from tests.nodes.test_network import IP, outside  # noqa: F401 (a fixture)

pytestmark = pytest.mark.e2e

ANSWER = "198.18.7.7"  # what the outside's server says every name is (a benchmarking range)

# A name server of one answer: any A question gets ANSWER (RFC 1035's wire format).
DNS_SERVER = """
import socket, struct, sys
answer = socket.inet_aton(sys.argv[2])
server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
server.bind((sys.argv[1], 53))
print("ready", flush=True)
while True:
    query, peer = server.recvfrom(512)
    ident, flags, questions = struct.unpack("!HHH", query[:6])
    end = query.index(b"\\0", 12) + 5
    question = query[12:end]
    qtype = struct.unpack("!H", question[-4:-2])[0]
    header = struct.pack("!HHHHHH", ident, 0x8180, 1, 1 if qtype == 1 else 0, 0, 0)
    record = b"\\xc0\\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + answer if qtype == 1 else b""
    server.sendto(header + question + record, peer)
"""


@pytest.fixture
def name_server(outside):  # noqa: F811
    """A name server on the outside machine, answering every A question with ANSWER."""
    served = subprocess.Popen(
        [IP, "netns", "exec", outside["netns"], sys.executable, "-c", DNS_SERVER]
        + [outside["address"], ANSWER],
        stdout=subprocess.PIPE,
        text=True,
        env=network.ENV,
    )
    try:
        assert served.stdout.readline().strip() == "ready"
        yield outside["address"]
    finally:
        served.kill()
        served.wait(10)


@pytest.fixture
def node_resolv_conf(tmp_path, monkeypatch):
    """The node's resolv.conf as the agent reads it, written by the test."""
    path = tmp_path / "resolv.conf"
    monkeypatch.setattr(resolver, "NODE_RESOLV_CONF", path)
    monkeypatch.setattr(resolver, "UPSTREAM_RESOLV_CONF", tmp_path / "absent")
    return path


def test_R19_a_member_resolves_through_a_server_it_can_reach_never_the_nodes_stub(
    node,  # noqa: F811
    name_server,
    node_resolv_conf,
):
    node_resolv_conf.write_text(
        f"nameserver 127.0.0.53\nnameserver {name_server}\nsearch lab.example\n"
        "options timeout:1 attempts:1\n"
    )
    output, ended = node.attack(
        "cat /etc/resolv.conf; echo ---; getent hosts model-store.lab.example; "
        'echo "self: $(getent hosts "$(hostname)")"; getent hosts localhost',
        member_id="m-dns",
    )
    assert ended.exit_code == 0, output
    conf, lookups = output.split("---\n")
    assert "127.0.0.53" not in conf and f"nameserver {name_server}" in conf, conf
    assert "search lab.example" in conf
    found = [line.split() for line in lookups.splitlines()]
    assert found[0] == [ANSWER, "model-store.lab.example"], output
    assert found[1] == ["self:", ended.address, "m-dns"], output  # its own name, its address
    assert found[2][0] in ("127.0.0.1", "::1") and "localhost" in found[2], output
    assert f"DNS {name_server}" in ended.confinement


def test_R19_a_member_is_given_no_server_where_the_node_names_none_it_can_reach(
    node,  # noqa: F811
    node_resolv_conf,
):
    """Only the stub: the member's file names no server, so a lookup fails at once rather
    than waiting for a server it cannot reach, and the member's record says so."""
    node_resolv_conf.write_text("nameserver 127.0.0.53\nnameserver 169.254.169.253\n")
    began = time.monotonic()
    output, ended = node.attack(
        "grep -c nameserver /etc/resolv.conf; getent hosts model-store.example; echo $?",
        member_id="m-nodns",
    )
    assert output.splitlines()[0] == "0", output
    assert output.splitlines()[-1] == "2", output  # getent: not found
    assert time.monotonic() - began < 20
    assert "no DNS server" in ended.confinement


def test_R19_an_image_member_gets_the_same_files_whatever_its_image_holds(
    image_node,  # noqa: F811
    name_server,
    node_resolv_conf,
):
    """busybox's image has an empty /etc: its member still resolves its own name and
    localhost, and asks the reachable server."""
    node_resolv_conf.write_text(f"nameserver 127.0.0.53\nnameserver {name_server}\n")
    output, ended = image_node.attack(
        "cat /etc/resolv.conf; echo ---; cat /etc/hosts", image=IMAGE, member_id="m-image-dns"
    )
    assert ended.exit_code == 0, output
    conf, hosts = output.split("---\n")
    assert [line for line in conf.splitlines() if not line.startswith("#")] == [
        f"nameserver {name_server}"
    ], output
    assert f"{ended.address}\tm-image-dns" in hosts.splitlines(), output
    assert "127.0.0.1\tlocalhost" in hosts.splitlines(), output
