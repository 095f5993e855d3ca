"""What a confined member resolves with (R19): the node's name servers a member can reach, or
its local stub's upstream ones, never one it cannot reach; its own hosts file. Pure, no
runtime: what a real member reads is proven in tests/nodes/test_member_dns.py."""

import ipaddress

import pytest

from nodes.agent.member import network
from nodes.agent.member.resolver import (
    MAX_SERVERS,
    hosts,
    reachable_from_member,
    resolv_conf,
    servers_of,
)

NODE_ADDRESSES = {"192.168.7.10", "10.0.0.5"}


def reachable(address: str) -> bool:
    return reachable_from_member(
        address, network.deny_networks(["172.30.0.0/16"]), NODE_ADDRESSES.__contains__
    )


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#")]


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("8.8.8.8", True),
        ("10.255.255.53", True),  # a server on the node's network, not the node itself
        ("127.0.0.53", False),  # systemd-resolved's stub: the node's loopback
        ("127.0.0.1", False),
        ("169.254.169.253", False),  # a cloud's link-local resolver (metadata's network)
        ("169.254.0.1", False),
        ("192.168.7.10", False),  # the node's own address: its input chain drops it
        ("10.213.0.7", False),  # another member
        ("172.30.4.4", False),  # the deny list (the console's networks)
        ("172.29.255.255", True),  # just outside it
        ("::1", False),
        ("2001:4860:4860::8888", False),  # a member's network is IPv4
        ("0.0.0.0", False),
        ("224.0.0.251", False),
        ("not-an-address", False),
        ("", False),
    ],
)
def test_R19_a_server_is_reachable_only_where_a_members_packets_leave_the_node(address, expected):
    assert reachable(address) is expected


def test_R19_the_nodes_reachable_servers_are_taken_in_order_with_search_and_options():
    node = (
        "# comment\nnameserver 127.0.0.53\nnameserver 9.9.9.9\n"
        "search  lab.example corp.example\nnameserver 1.1.1.1\noptions edns0 trust-ad\n"
        "sortlist 130.155.160.0/255.255.240.0\n"
    )
    made = resolv_conf(node, "nameserver 8.8.8.8\n", reachable)
    assert made.servers == ("9.9.9.9", "1.1.1.1")  # the upstream list is not needed
    assert lines(made.text) == [
        "nameserver 9.9.9.9",
        "nameserver 1.1.1.1",
        "search lab.example corp.example",
        "options edns0 trust-ad",
    ]


def test_R19_a_node_that_names_only_its_stub_gives_the_stubs_upstream_servers():
    node = "nameserver 127.0.0.53\noptions edns0 trust-ad\nsearch lab.example\n"
    upstream = "nameserver 10.1.2.3\nnameserver 169.254.169.253\nsearch dc.example\n"
    made = resolv_conf(node, upstream, reachable)
    assert made.servers == ("10.1.2.3",)
    # The search domains of the file the servers came from: the stub's own are the same
    # list systemd-resolved writes into both.
    assert lines(made.text) == ["nameserver 10.1.2.3", "search dc.example"]


def test_R19_no_reachable_server_anywhere_gives_none_and_says_why():
    made = resolv_conf(
        "nameserver 127.0.0.53\nsearch lab.example\n", "nameserver 169.254.169.253\n", reachable
    )
    assert made.servers == ()
    assert "nameserver" not in made.text.replace("servers", "")
    assert "# None: the node names only servers a member cannot reach." in made.text
    assert lines(made.text) == ["search lab.example"]


def test_R19_no_resolv_conf_on_the_node_gives_an_empty_list():
    made = resolv_conf("", "", reachable)
    assert (made.servers, lines(made.text)) == ((), [])


def test_R19_one_reachable_server_is_one_line():
    made = resolv_conf("nameserver 1.1.1.1\n", "", reachable)
    assert made.servers == ("1.1.1.1",) and lines(made.text) == ["nameserver 1.1.1.1"]


def test_R19_at_most_three_distinct_servers_as_the_c_library_asks():
    node = "".join(f"nameserver 9.9.9.{n}\n" for n in (1, 1, 2, 3, 4, 5))
    made = resolv_conf(node, "", reachable)
    assert made.servers == ("9.9.9.1", "9.9.9.2", "9.9.9.3")
    assert len(made.servers) == MAX_SERVERS


def test_servers_are_read_as_resolv_conf_writes_them():
    text = "nameserver\nnameserver 1.1.1.1\n  nameserver   2.2.2.2  # x\n;nameserver 3.3.3.3\n"
    text += "nameserver fe80::1%eth0\nnameservers 4.4.4.4\n"
    assert servers_of(text) == ["1.1.1.1", "2.2.2.2", "fe80::1"]


def test_R19_a_members_hosts_name_loopback_and_its_own_address():
    said = hosts("j-41-m0", "10.213.0.9")
    assert said.splitlines() == [
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        "10.213.0.9\tj-41-m0",
    ]
    with pytest.raises(ipaddress.AddressValueError):
        hosts("j-41-m0", "10.213.0.9\n6.6.6.6 evil")  # never a line it did not mean
