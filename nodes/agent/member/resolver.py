"""The names a confined member resolves (R19): its own ``/etc/resolv.conf`` and ``/etc/hosts``,
written by the agent into the member's bundle and bound read-only over what its root has.

A member's network is its own: the node's loopback, its own addresses and link-local ones
are out of its reach. So the node's resolver list is taken only for the servers a member can
reach; where the node names none of those — a local stub such as systemd-resolved's
127.0.0.53, or a cloud's link-local resolver — the list the stub itself asks is taken
(systemd-resolved's ``/run/systemd/resolve/resolv.conf``), as Docker and Podman do. Where
nothing is left, the member's file says so and the member resolves nothing beyond its hosts
file: it is never handed a server it cannot reach, to wait on for its timeout.

An image member gets the same two files, so that ``localhost`` and its own name resolve
whatever its image holds. Deciding is pure (``resolv_conf``, ``hosts``); ``write`` reads the
node's files and writes the member's.
"""

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import bundle, launch, network

NODE_RESOLV_CONF = Path("/etc/resolv.conf")
# What systemd-resolved's stub asks, where the node runs it.
UPSTREAM_RESOLV_CONF = Path("/run/systemd/resolve/resolv.conf")
# The lines of a resolv.conf a member keeps beside its servers (resolv.conf(5)).
KEPT = ("search", "domain", "options")
# The most servers the C library asks (MAXNS).
MAX_SERVERS = 3


@dataclass(frozen=True)
class Resolver:
    """A member's ``/etc/resolv.conf``, and the servers it names."""

    text: str
    servers: tuple[str, ...]


def servers_of(text: str) -> list[str]:
    """The ``nameserver`` addresses of a resolv.conf, in its order (a zone index dropped)."""
    found = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            found.append(words[1].split("%")[0])
    return found


def resolv_conf(node: str, upstream: str, reachable: Callable[[str], bool]) -> Resolver:
    """The member's resolv.conf: the node's servers it can reach, or where there are none, its
    stub's upstream ones it can reach; the search, domain and options lines of the file the
    servers came from."""
    for text in (node, upstream):
        servers = [address for address in servers_of(text) if reachable(address)]
        if servers:
            break
    else:
        text, servers = node, []
    servers = list(dict.fromkeys(servers))[:MAX_SERVERS]
    kept = [
        " ".join(line.split())
        for line in text.splitlines()
        if line.split() and line.split()[0] in KEPT
    ]
    lines = ["# Written by the Tuneplane agent: the servers a member can reach (R19)."]
    if not servers:
        lines.append("# None: the node names only servers a member cannot reach.")
    lines += [f"nameserver {address}" for address in servers] + kept
    return Resolver(text="\n".join(lines) + "\n", servers=tuple(servers))


def hosts(hostname: str, address: str) -> str:
    """The member's /etc/hosts: loopback, and its own name at its own address."""
    return (
        "127.0.0.1\tlocalhost\n"
        "::1\tlocalhost ip6-localhost ip6-loopback\n"
        f"{ipaddress.IPv4Address(address)}\t{hostname}\n"
    )


def reachable_from_member(
    address: str,
    deny: Sequence[ipaddress.IPv4Network],
    is_local: Callable[[str], bool],
) -> bool:
    """Whether a member's packets to ``address`` leave the node (network.nft_member): an IPv4
    address that is not loopback, link-local, another member's, denied or the node's own."""
    try:
        found = ipaddress.ip_address(address)
    except ValueError:
        return False
    if found.version != 4 or found.is_loopback or found.is_unspecified or found.is_multicast:
        return False
    if found in network.LINK_LOCAL or found in network.SUBNET:
        return False
    if any(found in denied for denied in deny):
        return False
    return not is_local(address)


def is_node_address(address: str) -> bool:
    """Whether ``address`` is one of this node's own (a socket binds to it): the node's input
    chain drops what a member sends to those."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def write(
    box_dir: Path, hostname: str, address: str, deny: Sequence[ipaddress.IPv4Network]
) -> tuple[Resolver, tuple[bundle.Bind, ...]]:
    """The member's two files written in its bundle (root's dir; the files readable by the
    member's uid through the binds), and the binds that put them at ``/etc``."""
    resolver = resolv_conf(
        _read(NODE_RESOLV_CONF),
        _read(UPSTREAM_RESOLV_CONF),
        lambda server: reachable_from_member(server, deny, is_node_address),
    )
    written = []
    for name, text in (("resolv.conf", resolver.text), ("hosts", hosts(hostname, address))):
        path = box_dir / name
        launch.write_new(path, text)
        path.chmod(0o644)  # whatever the agent's umask: the member's uid reads it
        written.append(bundle.Bind(str(path), f"/etc/{name}", True))
    return resolver, tuple(written)
