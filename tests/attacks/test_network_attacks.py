"""Attacks through the network (R19), by project B's member on a real agent as root: the
node's Redis and PostgreSQL, its web and every address it has, the web's and the gateway's
/metrics, a squatted served port. The review of issue 46 reached all of them from a member
sharing the node's network."""

import json
import socket
import subprocess
import sys
import urllib.request
from contextlib import contextmanager

import pytest

from placement.services.quotas import QuotaSpec, quotas_replace
from tests.agent_members import SERVER, free_port, looked_at, until
from tests.conftest import SYSTEM
from tests.e2e.agents import running_gateway
from tests.e2e.console import ROOT, console_env

from .conftest import SECRET

# A TCP connection attempt from inside the member, by bash alone: REACHED or denied.
DIAL = """
dial() {
  name=$1; host=$2; port=$3
  if timeout 3 bash -c "exec 3<>/dev/tcp/$host/$port" 2>/dev/null; then
    echo "$name: REACHED $host:$port"
  else
    echo "$name: denied $host:$port"
  fi
}
gateway=$(/usr/sbin/ip -4 route show default | awk '{print $3}')
echo "gateway: $gateway"
"""


def node_addresses() -> list[str]:
    """Every IPv4 address of the node but loopback's."""
    shown = subprocess.run(
        ["/usr/sbin/ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    found = {line.split()[3].split("/")[0] for line in shown.splitlines()}
    return sorted(address for address in found if not address.startswith("127."))


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_R19_R23_a_member_reaches_neither_redis_nor_postgresql_nor_the_web_nor_the_node(node):
    """From a member: the node's Redis (6379) and PostgreSQL (5432) on loopback, on its
    gateway and on every address the node has; a web port the node serves on all addresses;
    cloud metadata's link-local address. Each answers the node itself, so a refusal is the
    wall's."""
    assert listening(6379) and listening(5432)  # the node's own services are there
    web = socket.socket()
    web.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    web.bind(("0.0.0.0", 0))
    web.listen(8)
    web_port = web.getsockname()[1]
    try:
        script = DIAL
        for port in (6379, 5432, web_port):
            script += f"dial loopback-{port} 127.0.0.1 {port}\n"
            script += f'dial gateway-{port} "$gateway" {port}\n'
            for address in node_addresses():
                script += f"dial node-{address}-{port} {address} {port}\n"
        script += "dial metadata 169.254.169.254 80\n"
        output, ended = node.attack(script, timeout=120)
    finally:
        web.close()
    assert "gateway: 10." in output, output
    assert output.count(": denied ") >= 7, output
    assert "REACHED" not in output, output


def test_R19_a_squatted_port_answers_for_nobody_else(node):
    """The review's: B listened on the port A's deployment was then given; A's process
    looped on EADDRINUSE while the node's probe, and every client, reached B. Here B holds
    the port in its own namespace only: A's replica binds it, is probed at its own address,
    and the port the node maps answers A."""
    port = free_port()
    squat = (
        "python3 -c '\n"
        "import socket\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f's.bind(("0.0.0.0", {port})); s.listen(8); print("squatting", flush=True)\n'
        "while True:\n"
        '    c, _ = s.accept(); c.sendall(b"HTTP/1.0 200 OK\\r\\n\\r\\nsquatter"); c.close()\n'
        "'\n"
    )
    node.start("m-b", script=squat)
    until("squatting", lambda: "squatting" in node.output("m-b"), timeout=20)
    replica = node.start(
        "m-a",
        argv=["python3", "-c", SERVER],
        env={"MODEL": SECRET},
        serve={"port": port, "readiness_path": "/health"},
    )
    assert replica.address and replica.address != looked_at(node.executor, "m-b").address
    until("serving", lambda: "serving on" in node.output("m-a"), timeout=20)
    answer = json.loads(
        urllib.request.urlopen(f"http://{replica.address}:{port}/", timeout=5).read()
    )
    assert answer["env"]["MODEL"] == SECRET  # A's own process, at A's own address
    through_node = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read()
    assert b"squatter" not in through_node and SECRET.encode() in through_node
    a = looked_at(node.executor, "m-a")
    assert a.state == "running" and a.restarts == 0, (a.reason, a.detail, node.output("m-a"))
    # A host process may still bind the port on an address of the node's own: no member
    # holds any host port.
    with socket.socket() as host:
        host.bind(("127.0.0.2", port))


def test_R19_members_of_two_jobs_do_not_reach_each_other_and_a_gangs_master_is_reached(node):
    port = free_port()
    listen = (
        "python3 -c '\n"
        "import socket\n"
        "s = socket.socket()\n"
        f's.bind(("0.0.0.0", {port})); s.listen(8); print("listening", flush=True)\n'
        "while True:\n"
        '    c, _ = s.accept(); c.sendall(b"master\\n"); c.close()\n'
        "'\n"
    )
    rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0"}
    master = node.start("m-a", script=listen, rendezvous=rendezvous)
    until("listening", lambda: "listening" in node.output("m-a"), timeout=20)
    peer = (
        DIAL
        + f"dial direct {master.address} {port}\n"
        + 'dial master "$MASTER_ADDR" "$MASTER_PORT"\n'
        + "echo master-addr: $MASTER_ADDR\n"
    )
    other, _ = node.attack(peer, member_id="m-other")
    rank1, _ = node.attack(
        peer, member_id="m-rank1", rendezvous={**rendezvous, "RANK": "1"}, cards=[]
    )
    # Another job dials the master's own address: refused; only the mapped port answers,
    # as it would from another machine.
    assert "direct: denied" in other, other
    assert "master: REACHED" in rank1 and "master-addr: 10." in rank1, rank1


# An HTTP GET of each URL from inside the member, all at once: REACHED (any answer, its
# status and what it said) or denied. Each carries the headers a forged scrape would.
SCRAPE = """
export GATEWAY=$(/usr/sbin/ip -4 route show default | awk '{print $3}')
python3 - <<'PY'
import concurrent.futures, os, urllib.error, urllib.request
TARGETS = %r
def get(target):
    name, url = target
    url = url.replace("GATEWAY", os.environ["GATEWAY"])
    headers = {"X-Forwarded-For": "127.0.0.1", "X-Real-IP": "127.0.0.1"}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=3) as a:
            return f"{name}: REACHED {a.status} {a.read()!r}"
    except urllib.error.HTTPError as error:
        return f"{name}: REACHED {error.code} {error.read()!r}"
    except OSError as error:
        return f"{name}: denied ({error})"
with concurrent.futures.ThreadPoolExecutor(len(TARGETS)) as pool:
    for line in pool.map(get, TARGETS):
        print(line, flush=True)
PY
"""


@contextmanager
def web_on_every_address(tmp_path):
    """The web as production runs it (gunicorn), on every address of the node and for any
    Host: an operator's widest setting, so that only the wall and /metrics' own gate stand."""
    port, log = free_port(), tmp_path / "web.log"
    env = console_env(tmp_path, TUNEPLANE_ALLOWED_HOSTS="*", TUNEPLANE_SECRET_KEY="a" * 50)
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "tuneplane.wsgi", "-b", f"0.0.0.0:{port}"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        until("the web answering", lambda: listening(port) or process.poll() is not None)
        assert process.poll() is None, log.read_text()[-3000:]
        yield port
    finally:
        process.terminate()
        process.wait(20)


def scraped(port: int) -> str:
    """What /metrics on ``port`` tells the node itself, a configured scraper (loopback)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return answer.read().decode()


@pytest.mark.django_db(transaction=True)
def test_R19_R23_a_member_reads_neither_the_webs_nor_the_gateways_metrics(
    node, tmp_path, console_pki, make_fleet, member, vision
):
    """The review's: from a member, the web's /metrics (loopback allowed) showed every
    project's quota series. Here the web and the gateway serve /metrics on every address of
    the node; the node itself, a configured scraper, reads both projects' quotas there. B's
    member asks for them at loopback, at its gateway and at every address of the node, with
    a forged client address: it reaches none, and reads no series and no project's name."""
    fleet = make_fleet("shared", kind="node", capabilities=["train"])
    specs = [QuotaSpec("ml", guaranteed=4), QuotaSpec("cv", guaranteed=4, limit=6)]
    quotas_replace(actor=SYSTEM, fleet=fleet, specs=specs)
    metrics_port = free_port()
    with (
        web_on_every_address(tmp_path) as web_port,
        running_gateway(
            tmp_path, console_pki, TUNEPLANE_GATEWAY_METRICS_BIND=f"0.0.0.0:{metrics_port}"
        ),
    ):
        until("the gateway's metrics", lambda: listening(metrics_port))
        # There to be read, by the node itself.
        assert 'tuneplane_quota_limit{fleet="shared",project="cv",series=""} 6.0' in scraped(
            web_port
        )
        assert "tuneplane_gateway" in scraped(metrics_port)
        node.victim()
        targets = []
        for port in (web_port, metrics_port):
            for host in ("127.0.0.1", "GATEWAY", *node_addresses()):
                targets.append((f"{host}-{port}", f"http://{host}:{port}/metrics"))
        output, ended = node.attack(SCRAPE % targets, timeout=120)
    assert "tuneplane_" not in output and 'project="' not in output, output
    assert "Vision" not in output and SECRET not in output, output
    assert ended.exit_code == 0 and output.count(": denied ") == len(targets), output
    assert "REACHED" not in output, output
