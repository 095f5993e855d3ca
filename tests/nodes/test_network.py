"""A member's network of its own (R19), proven by attack on this machine as root: members are
real network namespaces made by ``network.attach``; their "processes" are small TCP servers
and clients run inside with ``ip netns exec``. "Outside" is a namespace of the test's own
behind a veth with TEST-NET addresses (198.51.100.0/24, 203.0.113.0/24) and a link-local
one: no packet leaves this machine. Every namespace, veth and rule a test makes goes with it.

The pure parts (names, the conflist, the nft text, reachable_address) are tested without
root at the end."""

import contextlib
import ipaddress
import json
import os
import random
import socket
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from nodes.agent.member import network
from tests.missing_parts import skip_missing

pytestmark = pytest.mark.e2e

PYTHON = "/usr/bin/python3"
IP = network.IP

# A server that answers each connection with its token and the address it saw the client
# at, so a test tells who answered and whether the client came through the node's NAT.
SERVER = """
import socket, sys
host, port, token = sys.argv[1], int(sys.argv[2]), sys.argv[3]
family = socket.AF_INET6 if ":" in host else socket.AF_INET
s = socket.socket(family, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
if family == socket.AF_INET6:
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.bind((host, port))
s.listen(64)
print("ready", flush=True)
while True:
    c, peer = s.accept()
    c.sendall(f"{token} {peer[0].removeprefix('::ffff:')}\\n".encode())
    c.close()
"""
CLIENT = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    c = socket.create_connection((host, port), timeout=float(sys.argv[3]))
    print(c.recv(200).decode().strip() or "empty")
except TimeoutError:
    print("timeout")
except OSError as error:
    print(type(error).__name__)
"""


def require_network() -> None:
    """These tests need root and the CNI plugins: in CI their absence fails, elsewhere it is
    a skip named on the run's last line."""
    if not network.unavailable():
        return
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("R19's tests run as root in CI")
        pytest.skip("R19's tests need root")
    skip_missing(
        "the CNI plugins, nftables or iptables",
        "apt-get install containernetworking-plugins nftables iptables",
    )


def run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=network.ENV)
    assert done.returncode == 0, (argv, done.stderr)
    return done.stdout


def in_netns(netns: str | None, *argv: str) -> list[str]:
    return [IP, "netns", "exec", netns, *argv] if netns else list(argv)


def ask(host: str, port: int, netns: str | None = None, timeout: float = 1.0) -> str:
    """What a client at ``netns`` (None: the host) gets from host:port — the server's line,
    or timeout / ConnectionRefusedError / OSError …"""
    done = subprocess.run(
        in_netns(netns, PYTHON, "-c", CLIENT, host, str(port), str(timeout)),
        capture_output=True,
        text=True,
        timeout=30,
        env=network.ENV,
    )
    return done.stdout.strip() or done.stderr.strip()


def netns_name(attached: network.Attached) -> str:
    return Path(attached.netns).name


def free_port() -> int:
    """A port no one on the host holds now (tests in other workers take theirs at random)."""
    while True:
        port = random.randint(20000, 45000)
        with socket.socket() as probe, contextlib.suppress(OSError):
            probe.bind(("0.0.0.0", port))
            return port


def host_addresses() -> list[str]:
    """Every IPv4 address of the host but loopback's: the node's own addresses."""
    found = json.loads(run(IP, "-4", "-j", "addr", "show"))
    return [
        info["local"]
        for link in found
        for info in link.get("addr_info", [])
        if not info["local"].startswith("127.")
    ]


def node_address() -> str:
    """The node's address (MASTER_ADDR as rank 0's node announces it): the default route's."""
    route = json.loads(run(IP, "-4", "-j", "route", "get", "192.0.2.200"))
    return route[0]["prefsrc"]


@pytest.fixture
def servers():
    """Start a server (on the host or in a namespace) that lives until the test ends."""
    started = []

    def serve(host: str, port: int, token: str, netns: str | None = None):
        process = subprocess.Popen(
            in_netns(netns, PYTHON, "-c", SERVER, host, str(port), token),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=network.ENV,
        )
        started.append(process)
        line = process.stdout.readline()
        assert line.strip() == "ready", process.stderr.read()
        return process

    yield serve
    for process in started:
        process.kill()
        process.wait()


@pytest.fixture
def state_dir(tmp_path):
    return tmp_path / "state"


@pytest.fixture
def members(state_dir):
    """attach() members of a scope of the test's own; each detached at the end, whatever
    happened, and its namespace checked gone."""
    require_network()
    made = []

    def attach(member_id: str, *, ports=(), deny_cidrs=(), scope: str | None = None):
        scope = scope or default_scope
        made.append((member_id, scope))
        return network.attach(
            member_id, scope=scope, ports=list(ports), state_dir=state_dir, deny_cidrs=deny_cidrs
        )

    default_scope = f"test-{uuid.uuid4().hex[:8]}"
    attach.scope = default_scope
    yield attach
    for member_id, scope in made:
        network.detach(member_id, scope=scope, state_dir=state_dir)
        assert not os.path.exists(network.names(member_id, scope).netns_path)


@pytest.fixture
def outside():
    """Another machine, as far as members can tell: a namespace behind a veth from the host,
    holding a TEST-NET address, a link-local address (cloud metadata's kind) and an address
    of a CIDR the tests deny, with host routes to the last two. The host itself reaches all
    three, so a member that does not is refused, not unrouted."""
    require_network()
    tag = uuid.uuid4().hex[:6]
    used = {ipaddress.ip_address(a) for a in host_addresses()}
    block = next(
        ipaddress.ip_network(f"198.51.100.{4 * n}/30")
        for n in random.sample(range(64), 64)
        if ipaddress.ip_address(f"198.51.100.{4 * n + 1}") not in used
    )
    host_side, far, name = str(block[1]), str(block[2]), f"tpt-out-{tag}"
    metadata = f"169.254.{random.randint(200, 250)}.{random.randint(1, 254)}"
    denied = f"203.0.113.{random.randint(1, 254)}"
    run(IP, "netns", "add", name)
    try:
        run(IP, "link", "add", f"tpo{tag}", "type", "veth", "peer", "name", "eth0", "netns", name)
        run(IP, "addr", "add", f"{host_side}/30", "dev", f"tpo{tag}")
        run(IP, "link", "set", f"tpo{tag}", "up")
        for address in (f"{far}/30", f"{metadata}/32", f"{denied}/32"):
            run(IP, "-n", name, "addr", "add", address, "dev", "eth0")
        run(IP, "-n", name, "link", "set", "eth0", "up")
        run(IP, "-n", name, "link", "set", "lo", "up")
        run(IP, "-n", name, "route", "add", "default", "via", host_side)
        for address in (metadata, denied):
            run(IP, "route", "add", f"{address}/32", "via", far, "dev", f"tpo{tag}")
        yield {
            "netns": name,
            "node": host_side,  # the node's address as the outside machine knows it
            "address": far,
            "metadata": metadata,
            "denied": denied,
        }
    finally:
        subprocess.run([IP, "link", "del", f"tpo{tag}"], capture_output=True, env=network.ENV)
        subprocess.run([IP, "netns", "del", name], capture_output=True, env=network.ENV)


def test_R19_a_member_reaches_no_address_of_the_node_and_no_loopback_service(members, servers):
    """A server on the host listening on every address (as PostgreSQL, Redis or the console's
    web may) answers the host itself at each of the node's addresses, and the member at
    none: not at the gateway of its own veth, not at the node's other addresses, not by the
    host veth's IPv6 link-local address; its 127.0.0.1 is its own loopback."""
    port = free_port()
    servers("::", port, "host-service")
    member = members("m-host")
    ns = netns_name(member)
    targets = [member.gateway, *host_addresses()]
    for address in targets:
        answer = ask(address, port)
        if address != member.gateway and address not in host_addresses():
            continue  # another test's namespace or member, gone while it was asked
        assert answer.startswith("host-service"), address  # the host reaches it
    for address in targets:
        assert not ask(address, port, ns).startswith("host-service"), address
    for address in ("127.0.0.1", member.gateway):
        assert "host-service" not in ask(address, 6379, ns)  # the node's Redis
        assert "host-service" not in ask(address, 5432, ns)  # and PostgreSQL
    host_if = run(IP, "-j", "route", "get", member.address)
    host_if = json.loads(host_if)[0]["dev"]
    link_local = next(
        info["local"]
        for link in json.loads(run(IP, "-6", "-j", "addr", "show", "dev", host_if))
        for info in link["addr_info"]
        if info["local"].startswith("fe80")
    )
    assert not ask(f"{link_local}%eth0", port, ns).startswith("host-service")


def test_R19_a_member_goes_out_through_the_nodes_nat_and_never_to_link_local(
    members, servers, outside
):
    """The outside answers a member and sees the node's address, never the member's; an
    address of 169.254.0.0/16 the host reaches (cloud metadata's kind) answers the member
    nothing."""
    port = free_port()
    for address in (outside["address"], outside["metadata"]):
        servers(address, port, f"outside-{address}", outside["netns"])
    member = members("m-out")
    ns = netns_name(member)
    answer = ask(outside["address"], port, ns)
    assert answer == f"outside-{outside['address']} {outside['node']}"
    assert member.address not in answer
    assert ask(outside["metadata"], port).startswith("outside-")  # the host reaches it
    assert ask(outside["metadata"], port, ns) == "timeout"


def test_R19_a_member_never_reaches_the_deny_list(members, servers, outside):
    """TUNEPLANE_MEMBER_DENY_CIDRS: a denied network (203.0.113.0/24 here) that the host
    reaches answers the member nothing, while the outside beside it still answers."""
    port = free_port()
    for address in (outside["address"], outside["denied"]):
        servers(address, port, f"outside-{address}", outside["netns"])
    member = members("m-deny", deny_cidrs=["192.0.2.77/32", f"{outside['denied']}/24"])
    ns = netns_name(member)
    assert ask(outside["denied"], port).startswith("outside-")  # the host reaches it
    assert ask(outside["denied"], port, ns) == "timeout"
    assert ask(outside["address"], port, ns).startswith("outside-")


# Receives datagrams for a while and prints each one's text and source, one a line.
UDP_RECEIVER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
s.settimeout(float(sys.argv[3]))
try:
    while True:
        data, peer = s.recvfrom(200)
        print(data.decode(), peer[0], flush=True)
except TimeoutError:
    pass
"""
UDP_SENDER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 0))
s.sendto(sys.argv[4].encode(), (sys.argv[2], int(sys.argv[3])))
"""


def test_R19_a_member_sends_nothing_from_an_address_not_its_own(members, outside):
    """A member that took another member's address (here root in its namespace adds it; a
    member under the runtime has no capability to) gets nothing out under that address,
    while its own address goes out."""
    port = free_port()
    member, neighbour = members("m-spoof"), members("m-neighbour")
    ns = netns_name(member)
    run(IP, "-n", ns, "addr", "add", f"{neighbour.address}/32", "dev", "eth0")
    receiver = subprocess.Popen(
        in_netns(outside["netns"], PYTHON, "-c", UDP_RECEIVER, outside["address"], str(port), "2"),
        stdout=subprocess.PIPE,
        text=True,
        env=network.ENV,
    )
    assert receiver.stdout.readline().strip() == "ready"
    for source in (member.address, neighbour.address):
        run(*in_netns(ns, PYTHON, "-c", UDP_SENDER, source, outside["address"], str(port), source))
    got = receiver.communicate(timeout=30)[0]
    assert f"{member.address} {outside['node']}" in got
    assert neighbour.address not in got


def test_R19_members_of_different_jobs_do_not_reach_each_other_directly(members, servers):
    """Member A listens on a port that is not mapped: B, on the same node, gets nothing at
    A's address, and A nothing at B's."""
    port = free_port()
    a, b = members("job-a.rank-0"), members("job-b.rank-0")
    servers("0.0.0.0", port, "a", netns_name(a))
    servers("0.0.0.0", port, "b", netns_name(b))
    assert ask(a.address, port).startswith("a")  # the host (the prober) reaches A
    assert ask(a.address, port, netns_name(b)) == "timeout"
    assert ask(b.address, port, netns_name(a)) == "timeout"


def test_R19_a_gangs_mapped_port_is_reached_from_members_other_machines_and_the_host(
    members, servers, outside
):
    """Rank 0 listens on MASTER_PORT, a ledger host port mapped to its own namespace: another
    member on this node reaches it at MASTER_ADDR 127.0.0.1 as reachable_address rewrites it
    and at the node's address; rank 0 reaches itself there too; another machine reaches it
    at the node's address; the host reaches it at the member's address and at its own
    127.0.0.1 and the ledger's port; inside its own namespace its loopback is up."""
    port = free_port()
    rank0 = members("gang.rank-0", ports=[port])
    rank1 = members("gang.rank-1")
    servers("0.0.0.0", port, "rank0", netns_name(rank0))
    for member in (rank1, rank0):
        master = network.reachable_address("127.0.0.1", member)
        assert master == member.gateway
        assert ask(master, port, netns_name(member)).startswith("rank0"), member
        assert ask(node_address(), port, netns_name(member)).startswith("rank0"), member
    assert ask(outside["node"], port, outside["netns"]).startswith("rank0")
    assert ask(rank0.address, port).startswith("rank0")
    assert ask("127.0.0.1", port).startswith("rank0")  # the ledger's port, on the host too
    assert ask("127.0.0.1", port, netns_name(rank0)).startswith("rank0")  # its own loopback


@pytest.fixture
def forward_dropped():
    """iptables' FORWARD ending in a DROP, as Docker leaves it (its FORWARD policy): a rule
    of the test's own at the end, not the policy, so tests beside it are not changed."""
    rule = ["FORWARD", "-m", "comment", "--comment", f"tuneplane-test-{uuid.uuid4().hex}"]
    rule += ["-j", "DROP"]
    run(network.IPTABLES, "-w", "-A", *rule)
    yield
    run(network.IPTABLES, "-w", "-D", *rule)


def test_R19_members_work_where_iptables_forward_drops_the_rest_as_dockers_does(
    forward_dropped, members, servers, outside
):
    """With FORWARD dropping what nothing accepted, a member still goes out through the
    node's NAT, and another machine still reaches its mapped port."""
    port = free_port()
    member = members("m-docker", ports=[port])
    servers(outside["address"], port, "outside", outside["netns"])
    servers("0.0.0.0", port, "member", netns_name(member))
    assert ask(outside["address"], port, netns_name(member)).startswith("outside")
    assert ask(outside["node"], port, outside["netns"]).startswith("member")


def test_R19_a_member_listening_on_any_address_takes_no_host_port(members, servers):
    """A member listening on 0.0.0.0:X (X not its mapped port) leaves host port X free: a
    host process binds it, and the node's 127.0.0.1:X answers the host process."""
    port = free_port()
    squatter = members("squatter")
    servers("0.0.0.0", port, "squatter", netns_name(squatter))
    servers("0.0.0.0", port, "deployment")
    assert ask("127.0.0.1", port).startswith("deployment")
    assert ask(node_address(), port).startswith("deployment")


def test_R19_attach_and_detach_are_idempotent_and_detach_takes_everything_down(members, state_dir):
    """Attaching twice answers the same; detaching twice is fine; after it no namespace,
    nft chain or map entry, port mapping, address in the pool or file of the member is
    left — also when the agent's file was lost first (a restart)."""
    port = free_port()
    first = members("m-idem", ports=[port], deny_cidrs=["203.0.113.0/24"])
    assert members("m-idem", ports=[port], deny_cidrs=["203.0.113.0/24"]) == first
    name = network.names("m-idem", members.scope)
    for lost_file in (False, True):
        if lost_file:
            first = members("m-idem", ports=[port])
            (state_dir / network.CACHE_DIR / f"{name.container_id}.json").unlink()
        assert os.path.exists(first.netns)
        assert name.chain in run(network.NFT, "list", "table", "inet", network.TABLE)
        assert name.container_id in run("/usr/sbin/iptables-save", "-t", "nat")
        network.detach("m-idem", scope=members.scope, state_dir=state_dir)
        network.detach("m-idem", scope=members.scope, state_dir=state_dir)
        assert not os.path.exists(first.netns)
        assert name.chain not in run(network.NFT, "list", "table", "inet", network.TABLE)
        assert name.container_id not in run("/usr/sbin/iptables-save")
        assert name.container_id not in run("/usr/sbin/iptables-save", "-t", "nat")
        pool = Path(network.DATA_DIR) / network.NETWORK
        assert first.address not in os.listdir(pool)
        assert not (state_dir / network.CACHE_DIR / f"{name.container_id}.json").exists()


def test_R19_a_leftover_namespace_of_the_member_is_taken_down_by_attach(members, state_dir):
    """A namespace left by an earlier life of the member id (its file gone) is replaced: the
    member gets a fresh, working one."""
    require_network()
    name = network.names("m-left", members.scope)
    run(IP, "netns", "add", name.netns)
    attached = members("m-left")
    assert attached.netns == name.netns_path
    assert attached.address in run(IP, "-n", name.netns, "addr", "show", "dev", "eth0")


def test_R19_two_agents_attach_concurrently_with_scopes_of_their_own(members, servers):
    """Agents side by side (two scopes, one member id each, several at once): every member
    has an address of its own and answers the host there."""
    scopes = [f"{members.scope}-{n}" for n in range(2)]
    with ThreadPoolExecutor(6) as pool:
        attached = list(
            pool.map(
                lambda job: members(f"m-{job[1]}", scope=job[0]),
                [(scope, n) for scope in scopes for n in range(3)],
            )
        )
    assert len({a.address for a in attached}) == len(attached)
    port = free_port()
    for n, member in enumerate(attached):
        servers("0.0.0.0", port, f"member-{n}", netns_name(member))
    for n, member in enumerate(attached):
        assert ask(member.address, port).startswith(f"member-{n} ")


# --- Pure parts, no root needed. ---


def test_R19_names_are_short_distinct_and_carry_the_member_id():
    long_id = "a" * 40 + ".rank-12"
    one, other = network.names(long_id, "scope-1"), network.names(long_id, "scope-2")
    assert one.netns != other.netns and one.chain != other.chain
    assert long_id in one.container_id and "scope-1" in one.container_id
    assert len(one.netns) <= 15 and len(one.chain) <= 31
    with pytest.raises(ValueError):
        network.names("../etc", "s")
    with pytest.raises(ValueError):
        network.names("m", "a/b")


def test_R19_the_conflist_maps_each_ledger_port_to_the_same_port_inside():
    plugins = network.conflist([8295, 29500])["plugins"]
    assert [p["type"] for p in plugins] == ["ptp", "portmap", "firewall"]
    assert plugins[0]["ipam"]["dataDir"] == network.DATA_DIR
    mappings = plugins[1]["runtimeConfig"]["portMappings"]
    assert {(m["hostPort"], m["containerPort"]) for m in mappings} == {
        (8295, 8295),
        (29500, 29500),
    }
    with pytest.raises(ValueError):
        network.conflist([0])


def test_R19_the_deny_list_is_parsed_strictly():
    assert [str(n) for n in network.deny_networks(["10.1.2.3/8", " ", "fd00::/8"])] == [
        "10.0.0.0/8"
    ]
    with pytest.raises(ValueError, match="nonsense"):
        network.deny_networks(["nonsense"])


def test_R19_a_members_chain_drops_link_local_the_deny_list_and_other_members():
    text = network.nft_member(
        "member_abc", "veth1234", "10.213.0.9", network.deny_networks(["203.0.113.0/24"])
    )
    assert "ip saddr != 10.213.0.9 drop" in text
    assert "ip daddr 169.254.0.0/16 drop" in text
    assert "ip daddr { 203.0.113.0/24 } drop" in text
    assert f"ip daddr {network.SUBNET} drop" in text
    assert text.index("ct status dnat accept") < text.index("169.254.0.0/16")
    with pytest.raises(ValueError):
        network.nft_member("member_abc", 'x" ; flush ruleset', "10.213.0.9", [])


@pytest.mark.parametrize(
    "address, expected",
    [
        ("127.0.0.1", "10.213.0.1"),
        ("127.1.2.3", "10.213.0.1"),
        ("::1", "10.213.0.1"),
        ("localhost", "10.213.0.1"),
        ("192.0.2.2", "192.0.2.2"),
        ("node-7.example", "node-7.example"),
    ],
)
def test_R19_a_loopback_master_addr_is_rewritten_to_the_gateway(address, expected):
    attached = network.Attached("/run/netns/tp-x", "10.213.0.5", "10.213.0.1")
    assert network.reachable_address(address, attached) == expected
