"""What a member's network of its own costs (R19; issue 46: a served port through the mapping
carries at least 0.8 of what host loopback carries, requests per second on one core, same
server): one TCP echo server pinned to one core, asked by one client on the other, on host
loopback and through the port mapping from another namespace (another machine, as far as the
node can tell) and, as the fair base for the mapping's own cost, from that namespace to a
process of the node's own — both with a new connection per request (what conntrack and DNAT
cost most) and with one connection kept; and what attach() plus detach() take. Printed, not
asserted."""

import os
import statistics
import subprocess
import time

import pytest

from nodes.agent.member import network
from tests.nodes.test_network import (  # noqa: F401 -- fixtures, found by name
    PYTHON,
    free_port,
    in_netns,
    members,
    netns_name,
    outside,
    state_dir,
)

pytestmark = pytest.mark.bench

SECONDS = float(os.environ.get("TUNEPLANE_BENCH_NETWORK_SECONDS", "2"))
REPEATS = int(os.environ.get("TUNEPLANE_BENCH_NETWORK_REPEATS", "3"))
ROUNDS = int(os.environ.get("TUNEPLANE_BENCH_NETWORK_ROUNDS", "10"))
TASKSET = "/usr/bin/taskset"

ECHO_SERVER = """
import selectors, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1024)
s.setblocking(False)
sel = selectors.DefaultSelector()
sel.register(s, selectors.EVENT_READ)
print("ready", flush=True)
while True:
    for key, _ in sel.select():
        if key.fileobj is s:
            c, _ = s.accept()
            c.setblocking(False)
            sel.register(c, selectors.EVENT_READ)
            continue
        try:
            data = key.fileobj.recv(4096)
        except ConnectionError:
            data = b""
        if data:
            key.fileobj.send(data)
        else:
            sel.unregister(key.fileobj)
            key.fileobj.close()
"""
ECHO_CLIENT = """
import socket, sys, time
host, port, seconds, mode = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
done, end = 0, time.perf_counter() + seconds
kept = socket.create_connection((host, port)) if mode == "kept" else None
while time.perf_counter() < end:
    c = kept or socket.create_connection((host, port))
    c.sendall(b"ping\\n")
    assert c.recv(16) == b"ping\\n"
    if not kept:
        c.close()
    done += 1
print(done / seconds)
"""


def rate(server_netns, client_netns, bind, host, port) -> dict[str, float]:
    server = subprocess.Popen(
        in_netns(server_netns, TASKSET, "-c", "0", PYTHON, "-c", ECHO_SERVER, bind, str(port)),
        stdout=subprocess.PIPE,
        text=True,
        env=network.ENV,
    )
    try:
        assert server.stdout.readline().strip() == "ready"
        found = {}
        for mode in ("new", "kept"):
            done = subprocess.run(
                in_netns(client_netns, TASKSET, "-c", "1", PYTHON, "-c", ECHO_CLIENT)
                + [host, str(port), str(SECONDS), mode],
                capture_output=True,
                text=True,
                env=network.ENV,
                timeout=SECONDS + 30,
            )
            assert done.returncode == 0, done.stderr
            found[mode] = float(done.stdout)
        return found
    finally:
        server.kill()
        server.wait()


def test_bench_a_mapped_port_carries(members, outside, state_dir, capsys):  # noqa: F811
    port = free_port()
    member = members("bench-served", ports=[port])
    paths = {
        # Another port on loopback: the mapped one leads from the host's 127.0.0.1 to the member.
        "host loopback": (None, None, "127.0.0.1", "127.0.0.1", free_port()),
        "host to the member's address": (netns_name(member), None, "0.0.0.0", member.address, port),
        # The same other machine to a process of the node's own, unmapped: what the wall's
        # mapping (DNAT, the member's link) adds is the difference to the next line.
        "another machine, to the node": (
            None,
            outside["netns"],
            "0.0.0.0",
            outside["node"],
            free_port(),
        ),
        "another machine, mapped": (
            netns_name(member),
            outside["netns"],
            "0.0.0.0",
            outside["node"],
            port,
        ),
    }
    rates = {path: {"new": [], "kept": []} for path in paths}
    for _ in range(REPEATS):  # interleaved: the machine is shared, its load changes
        for path, how in paths.items():
            for mode, found in rate(*how).items():
                rates[path][mode].append(found)
    took = []
    for n in range(ROUNDS):
        began = time.perf_counter()
        network.attach(f"bench-{n}", scope=members.scope, ports=[port + 1], state_dir=state_dir)
        network.detach(f"bench-{n}", scope=members.scope, state_dir=state_dir)
        took.append(time.perf_counter() - began)
    with capsys.disabled():
        print(f"\nTCP echo, server on core 0, client on core 1, {SECONDS:.0f} s each:")
        for mode, what in (("new", "a connection per request"), ("kept", "one connection")):
            print(f"  {what}, best of {REPEATS}:")
            base = max(rates["host loopback"][mode])
            for path, found in rates.items():
                best = max(found[mode])
                print(f"    {path:>30}: {best:8.0f}/s ({best / base:.2f} of loopback)")
            mapped = max(rates["another machine, mapped"][mode])
            unmapped = max(rates["another machine, to the node"][mode])
            print(f"    the mapping carries {mapped / unmapped:.2f} of the unmapped path")
        print(
            f"attach()+detach(), one port, {ROUNDS} rounds: p50 "
            f"{statistics.median(took) * 1000:.0f} ms, max {max(took) * 1000:.0f} ms"
        )
