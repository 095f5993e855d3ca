"""A member's network of its own (R19): a network namespace wired by the standard CNI plugins
(Debian's ``containernetworking-plugins``), fenced by an nftables table of ours.

Wiring, per member: ``ptp`` (a veth pair: the member's ``eth0`` and a host end routed by the
host, so members meet only through the host's routing and filtering, never on a shared L2
segment that a missing ``br_netfilter`` would leave unfiltered), ``host-local`` IPAM (one pool
for the whole machine, so that agents side by side never hand out one address twice; it locks
its own store), ``portmap`` (the ledger's host ports DNATed to the same port in the member) and
``firewall`` (accepts the member's traffic in iptables' FORWARD, where Docker's DROP policy
would otherwise stop it).

Fence, machine-wide, in ``table inet tuneplane`` (nft_rules below): nothing from a member's
veth enters the host (input), except replies to connections the host opened (probes); a
member's packets are forwarded only from its own address, to mapped ports (``ct status
dnat``) or out through the node's masquerade, never to link-local addresses, the deny list or
another member; nothing reaches a member but replies and mapped ports.

Everything runs with absolute paths and a fixed environment (R17). ``attach`` and ``detach``
are idempotent and recover from the member's file in the agent's state dir, or without it
from the names derived from the member's id and the plugins' own stores."""

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

CNI_DIR = "/usr/lib/cni"
PLUGINS = ("ptp", "host-local", "portmap", "firewall")
NFT = "/usr/sbin/nft"
IPTABLES = "/usr/sbin/iptables"
IP = next((p for p in ("/usr/sbin/ip", "/sbin/ip", "/bin/ip") if os.path.exists(p)), "/sbin/ip")
NETNS_DIR = "/run/netns"
# The plugins find iptables and their IPAM plugin through these; never the member's or the
# agent's own environment (R17).
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}

# One network for every agent on the machine: host-local keeps its pool at DATA_DIR/NETWORK,
# under its own lock, so agents running side by side (the test suite's, or an agent beside
# its successor) never hand out one address twice.
NETWORK = "tuneplane"
DATA_DIR = "/var/lib/cni/networks"
SUBNET = ipaddress.ip_network("10.213.0.0/16")
LINK_LOCAL = ipaddress.ip_network("169.254.0.0/16")
TABLE = "tuneplane"
IFNAME = "eth0"
CACHE_DIR = "network"
# Serializes this machine's changes to the shared host rules (the CNI-ADMIN accept) between
# agents; the plugins and nft lock for themselves.
LOCK = "/run/lock/tuneplane-network.lock"
TIMEOUT = 30
NAME = re.compile(r"[A-Za-z0-9_.-]+")


class NetworkError(RuntimeError):
    """A step of wiring or unwiring a member's network failed; the message says which."""


@dataclass(frozen=True)
class Attached:
    """What a member's runtime and the agent need: the namespace's path (runc's
    ``linux.namespaces`` network ``path``), the member's address (probes reach it there) and
    its gateway (where the member reaches the node's mapped ports)."""

    netns: str
    address: str
    gateway: str


@dataclass(frozen=True)
class Names:
    """Everything of a member's network is named from its scope and id: the CNI container id
    (which carries both, as everything the agent makes does), the netns and the nft chain
    (a hash, short enough for any name limit)."""

    container_id: str
    netns: str
    chain: str

    @property
    def netns_path(self) -> str:
        return f"{NETNS_DIR}/{self.netns}"


def names(member_id: str, scope: str) -> Names:
    for what, text in (("member id", member_id), ("scope", scope)):
        if not NAME.fullmatch(text):
            raise ValueError(f"{what} {text!r} is not [A-Za-z0-9_.-]+")
    digest = hashlib.sha256(f"{scope}\0{member_id}".encode()).hexdigest()[:12]
    return Names(
        container_id=f"tuneplane.{scope}.{member_id}",
        netns=f"tp-{digest}",
        chain=f"member_{digest}",
    )


def deny_networks(deny_cidrs: Iterable[str]) -> list[ipaddress.IPv4Network]:
    """The deny list as IPv4 networks (host bits allowed: "10.1.2.3/8" is 10.0.0.0/8). IPv6
    entries add nothing: no IPv6 packet of a member is forwarded at all. A malformed entry
    is a ValueError naming it, never a silently open network."""
    found = []
    for text in deny_cidrs:
        text = text.strip()
        if not text:
            continue
        try:
            network = ipaddress.ip_network(text, strict=False)
        except ValueError as error:
            raise ValueError(f"deny CIDR {text!r}: {error}") from None
        if network.version == 4:
            found.append(network)
    return found


def plugin_configs(ports: Sequence[int]) -> list[dict]:
    """The conflist's plugins, in ADD order (DEL runs them in reverse)."""
    for port in ports:
        if not (isinstance(port, int) and 0 < port < 65536):
            raise ValueError(f"port {port!r} is not 1–65535")
    return [
        {
            "type": "ptp",
            "ipMasq": False,  # the node's masquerade is one nft rule of ours (nft_rules)
            "ipam": {
                "type": "host-local",
                "dataDir": DATA_DIR,
                "ranges": [[{"subnet": str(SUBNET)}]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        },
        {
            "type": "portmap",
            "snat": True,
            "runtimeConfig": {
                # TCP only: what is served, and a gang's rendezvous, are TCP; a UDP mapping
                # made portmap's ADD five times slower (it flushes conntrack for UDP).
                "portMappings": [
                    {"hostPort": port, "containerPort": port, "protocol": "tcp"}
                    for port in sorted(set(ports))
                ]
            },
        },
        {"type": "firewall", "backend": "iptables"},
    ]


def conflist(ports: Sequence[int]) -> dict:
    return {"cniVersion": "1.0.0", "name": NETWORK, "plugins": plugin_configs(ports)}


def nft_base() -> str:
    """The machine-wide table, made or remade in one nft transaction (idempotent, and safe
    with agents side by side: the base chains are the same for every agent; what is a
    member's lives in its own chain and the two sets)."""
    subnet = SUBNET
    return f"""\
table inet {TABLE} {{
    set member_ifs {{ type ifname; }}
    map member_chains {{ type ifname : verdict; }}
    chain input {{ type filter hook input priority filter; policy accept; }}
    chain forward {{ type filter hook forward priority filter; policy accept; }}
    chain postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}
}}
flush chain inet {TABLE} input
flush chain inet {TABLE} forward
flush chain inet {TABLE} postrouting
add rule inet {TABLE} input iifname @member_ifs ct state established,related accept
add rule inet {TABLE} input iifname @member_ifs drop
add rule inet {TABLE} forward iifname vmap @member_chains
add rule inet {TABLE} forward iifname @member_ifs drop
add rule inet {TABLE} forward oifname @member_ifs ct state established,related accept
add rule inet {TABLE} forward oifname @member_ifs ct status dnat accept
add rule inet {TABLE} forward oifname @member_ifs drop
add rule inet {TABLE} postrouting ip saddr {subnet} ip daddr != {subnet} masquerade
"""


def nft_member(
    chain: str, host_if: str, address: str, deny: Sequence[ipaddress.IPv4Network]
) -> str:
    """A member's chain, entered from ``forward`` for packets from its veth: its own address
    only; mapped ports (DNAT, on this node or hairpinned back to a member) are
    allowed; link-local, the deny list and other members are not; the rest leaves through
    the masquerade."""
    address = str(ipaddress.IPv4Address(address))
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,15}", host_if):
        raise ValueError(f"host interface {host_if!r}")
    denied = ", ".join(str(network) for network in deny)
    rules = [
        f"ip saddr != {address} drop",
        "ct status dnat accept",
        f"ip daddr {LINK_LOCAL} drop",
        *([f"ip daddr {{ {denied} }} drop"] if denied else []),
        f"ip daddr {SUBNET} drop",
        "accept",
    ]
    return (
        f"add chain inet {TABLE} {chain}\n"
        f"flush chain inet {TABLE} {chain}\n"
        + "".join(f"add rule inet {TABLE} {chain} {rule}\n" for rule in rules)
        + f'add element inet {TABLE} member_ifs {{ "{host_if}" }}\n'
        + f'add element inet {TABLE} member_chains {{ "{host_if}" : jump {chain} }}\n'
    )


def nft_member_removal(chain: str, host_ifs: Iterable[str], chain_exists: bool) -> str:
    text = "".join(
        f'delete element inet {TABLE} member_chains {{ "{name}" }}\n'
        f'delete element inet {TABLE} member_ifs {{ "{name}" }}\n'
        for name in host_ifs
    )
    if chain_exists:
        text += f"flush chain inet {TABLE} {chain}\ndelete chain inet {TABLE} {chain}\n"
    return text


# The accept in iptables' FORWARD for connections DNATed to a member from elsewhere: the
# firewall plugin accepts what a member sends and the replies to it, not new connections to
# its mapped ports, which a FORWARD policy of DROP (Docker's) would stop. CNI-ADMIN is the
# firewall plugin's chain for an administrator's rules; it never flushes it.
ADMIN_ACCEPT = ["-d", str(SUBNET), "-m", "conntrack", "--ctstate", "DNAT", "-j", "ACCEPT"]


def reachable_address(address: str, attached: Attached) -> str:
    """Where a member reaches ``address``: a loopback address (a gang's MASTER_ADDR of
    127.0.0.1 when rank 0 is on this node) is the member's own loopback inside its
    namespace, so the node's mapped ports are reached at its gateway; any other address is
    reached as it is."""
    text = address.strip()
    if text.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return attached.gateway
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(text.strip("[]")).is_loopback:
            return attached.gateway
    return address


def unavailable() -> str:
    """Why members cannot have networks of their own here (not root, a tool missing), or
    "" when they can."""
    if os.geteuid() != 0:
        return "the agent is not root: members' networks need root"
    missing = [
        f"{CNI_DIR}/{name}" for name in PLUGINS if not os.access(f"{CNI_DIR}/{name}", os.X_OK)
    ]
    missing += [path for path in (NFT, IPTABLES, IP) if not os.access(path, os.X_OK)]
    if missing:
        return (
            f"missing {', '.join(missing)} "
            "(apt-get install containernetworking-plugins nftables iptables iproute2)"
        )
    return ""


def _run(argv: list[str], stdin: str = "", env: dict | None = None, check: bool = True):
    done = subprocess.run(
        argv,
        input=stdin,
        env=env or ENV,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd="/",
    )
    if check and done.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: {(done.stderr or done.stdout).strip()[:500]}")
    return done


def _plugin(command: str, config: dict, name: Names, netns: str, prev: dict | None) -> dict:
    plugin = {"cniVersion": "1.0.0", "name": NETWORK, **config}
    if prev is not None:
        plugin["prevResult"] = prev
    env = {
        **ENV,
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": name.container_id,
        "CNI_NETNS": netns,
        "CNI_IFNAME": IFNAME,
        "CNI_PATH": CNI_DIR,
    }
    done = _run([f"{CNI_DIR}/{config['type']}"], json.dumps(plugin), env=env, check=False)
    if done.returncode != 0:
        raise NetworkError(
            f"CNI {config['type']} {command}: {(done.stdout or done.stderr).strip()[:500]}"
        )
    return json.loads(done.stdout) if done.stdout.strip() else {}


@contextlib.contextmanager
def _machine_lock():
    os.makedirs(os.path.dirname(LOCK), exist_ok=True)
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def attached_members(state_dir: Path) -> list[tuple[str, str]]:
    """The (member id, scope) of every network an agent's state dir says it wired and has not
    taken down: what a sweep of what an agent left behind detaches."""
    found = []
    for path in sorted((Path(state_dir) / CACHE_DIR).glob("*.json")):
        try:
            record = json.loads(path.read_text())
            found.append((record["member_id"], record["scope"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def _cache_path(state_dir: Path, member_id: str, scope: str) -> Path:
    return Path(state_dir) / CACHE_DIR / f"{names(member_id, scope).container_id}.json"


def _read_cache(state_dir: Path, member_id: str, scope: str) -> dict | None:
    try:
        return json.loads(_cache_path(state_dir, member_id, scope).read_text())
    except (OSError, ValueError):
        return None


def _write_cache(state_dir: Path, member_id: str, scope: str, record: dict) -> None:
    path = _cache_path(state_dir, member_id, scope)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump(record, file)
    os.replace(temporary, path)


def _host_interface(result: dict) -> str:
    return next(i["name"] for i in result.get("interfaces", []) if not i.get("sandbox"))


def _member_ip(result: dict) -> tuple[str, str]:
    ip = next(i for i in result["ips"] if ipaddress.ip_interface(i["address"]).version == 4)
    return str(ipaddress.ip_interface(ip["address"]).ip), ip["gateway"]


# Whether this process made the machine's table and CNI-ADMIN's accept: once, not at every
# member's start. A member's rules go into that table; where it has gone since (flushed by
# hand), adding them fails and the table is made again before a second try.
_host_rules_made = False


def _ensure_host_rules(again: bool = False) -> None:
    global _host_rules_made
    if _host_rules_made and not again:
        return
    _host_rules_made = False
    _run([NFT, "-f", "-"], nft_base())
    with _machine_lock():
        if _run([IPTABLES, "-w", "-C", "CNI-ADMIN", *ADMIN_ACCEPT], check=False).returncode:
            _run([IPTABLES, "-w", "-A", "CNI-ADMIN", *ADMIN_ACCEPT])
    _host_rules_made = True


def _fence(chain: str, host_if: str, address: str, deny) -> None:
    """The member's chain in the machine's table: one nft transaction."""
    rules = nft_member(chain, host_if, address, deny)
    _ensure_host_rules()
    try:
        _run([NFT, "-f", "-"], rules)
    except NetworkError:
        _ensure_host_rules(again=True)
        _run([NFT, "-f", "-"], rules)


def attach(
    member_id: str,
    *,
    scope: str,
    ports: Sequence[int],
    state_dir: Path,
    deny_cidrs: Sequence[str] = (),
) -> Attached:
    """The member's namespace, wired and fenced, ready for its runtime. Attaching a member
    that is attached already answers the same, with the rules made again; a leftover of an
    earlier life of the member id (a namespace without its file, or the reverse) is taken
    down first."""
    name = names(member_id, scope)
    deny = deny_networks(deny_cidrs)
    configs = plugin_configs(ports)
    cached = _read_cache(state_dir, member_id, scope)
    if (
        cached
        and sorted(cached.get("ports", [])) == sorted(set(ports))
        and os.path.exists(name.netns_path)
    ):
        result = cached["result"]
    else:
        # A member's leftovers start with its namespace or its address (_wire takes down
        # what it made when it fails); a fresh member spares the plugins' DEL.
        if cached or os.path.exists(name.netns_path) or _stored_address(name.container_id):
            detach(member_id, scope=scope, state_dir=state_dir)
        result = _wire(name, configs)
        _write_cache(
            state_dir,
            member_id,
            scope,
            {
                "container_id": name.container_id,
                "member_id": member_id,
                "scope": scope,
                "netns": name.netns,
                "ports": sorted(set(ports)),
                "result": result,
            },
        )
    address, gateway = _member_ip(result)
    try:
        _fence(name.chain, _host_interface(result), address, deny)
    except NetworkError:
        detach(member_id, scope=scope, state_dir=state_dir)
        raise
    return Attached(netns=name.netns_path, address=address, gateway=gateway)


def _wire(name: Names, configs: list[dict]) -> dict:
    _run([IP, "netns", "add", name.netns])
    done: list[dict] = []
    result = None
    try:
        _run([IP, "-n", name.netns, "link", "set", "lo", "up"])
        for config in configs:
            result = _plugin("ADD", config, name, name.netns_path, result) or result
            done.append(config)
    except (NetworkError, ValueError, subprocess.TimeoutExpired):
        for config in reversed(done):
            with contextlib.suppress(NetworkError):
                _plugin("DEL", config, name, name.netns_path, result)
        _run([IP, "netns", "delete", name.netns], check=False)
        raise
    return result


def _stored_address(container_id: str) -> str | None:
    """The member's address as host-local's store holds it (a file named by the address,
    the container id on its first line): detach finds it when the agent's file is gone."""
    store = Path(DATA_DIR) / NETWORK
    with contextlib.suppress(OSError):
        for entry in store.iterdir():
            with contextlib.suppress(OSError, ValueError):
                if entry.read_text().partition("\n")[0].strip() == container_id:
                    return str(ipaddress.IPv4Address(entry.name))
    return None


def _nft_member_state(chain: str) -> tuple[list[str], bool]:
    """The host interfaces whose packets jump to ``chain``, and whether the chain exists."""
    done = _run([NFT, "-j", "list", "table", "inet", TABLE], check=False)
    if done.returncode:
        return [], False
    interfaces, exists = [], False
    for item in json.loads(done.stdout).get("nftables", []):
        if "chain" in item and item["chain"].get("name") == chain:
            exists = True
        found = item.get("map", {})
        if found.get("name") == "member_chains":
            for key, verdict in found.get("elem", []) or []:
                if verdict.get("jump", {}).get("target") == chain:
                    interfaces.append(key)
    return interfaces, exists


def detach(member_id: str, *, scope: str, state_dir: Path) -> None:
    """Everything attach made for the member, taken down: rules, plugins' state (its
    address back to the pool, its port mappings), the namespace and the agent's file.
    Idempotent; with the file gone it works from the derived names and host-local's store."""
    name = names(member_id, scope)
    cached = _read_cache(state_dir, member_id, scope)
    result = cached["result"] if cached else None
    if result is None:
        address = _stored_address(name.container_id)
        if address:
            result = {
                "cniVersion": "1.0.0",
                "ips": [{"address": f"{address}/{SUBNET.prefixlen}", "gateway": str(SUBNET[1])}],
            }
    interfaces, chain_exists = _nft_member_state(name.chain)
    if interfaces or chain_exists:
        _run([NFT, "-f", "-"], nft_member_removal(name.chain, interfaces, chain_exists))
    netns = name.netns_path if os.path.exists(name.netns_path) else ""
    errors = []
    # portmap's DEL does nothing without a mapping; any one will do: it takes down the
    # member's chain by its name (from the container id), whatever the ports were.
    for config in reversed(plugin_configs((cached or {}).get("ports") or [1])):
        if config["type"] == "firewall" and result is None:
            continue  # it needs the address; without one it never added anything
        try:
            _plugin("DEL", config, name, netns, result)
        except NetworkError as error:
            errors.append(str(error))
    if netns:
        _run([IP, "netns", "delete", name.netns], check=False)
    if os.path.exists(name.netns_path):
        errors.append(f"{name.netns_path} is still there")
    if errors:
        raise NetworkError("; ".join(errors))
    with contextlib.suppress(FileNotFoundError):
        _cache_path(state_dir, member_id, scope).unlink()
