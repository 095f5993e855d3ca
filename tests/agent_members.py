"""What the agent's member tests share (tests/nodes/test_members.py, test_replicas.py, the e2e
serving tests): its cards, how a member is started and read as the agent looks at it, and a
trivial HTTP server to serve as a replica. The executor fixture is tests/nodes/conftest.py's."""

import json
import os
import socket
import time
import urllib.request
from pathlib import Path

from tests.conftest import H100_DEVICES

CARDS = [{"index": d["index"], "uuid": d["uuid"]} for d in H100_DEVICES]


def start(executor, member_id, cards, **payload):
    return executor.accept(member_id, "start", {"cards": cards, **payload})


def looked_at(executor, member_id):
    """The member after the agent has looked at what runs, as it does every second."""
    executor.tick()
    return next(c for c in executor.known() if c.command_id == member_id)


def settled(executor, member_id, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        member = looked_at(executor, member_id)
        if member.state != "running":
            return member
        time.sleep(0.1)
    raise AssertionError(f"{member_id} still running")


def cleaned_up(executor, member_id, timeout=10):
    """The member once its node has ended it and cleaned up after it (R7, R13), as the
    agent's tick finds it; its cleanup is asked first elsewhere."""
    member = settled(executor, member_id)
    deadline = time.monotonic() + timeout
    while not member.cleaned and time.monotonic() < deadline:
        time.sleep(0.1)
        member = looked_at(executor, member_id)
    return member


# A trivial server: /health answers HEALTH_STATUS (200 unless the env says otherwise); every
# path answers its pid (its PID namespace's, when confined), a token new at each launch and
# the env a replica gets.
SERVER = """
import http.server, json, os, uuid
LAUNCH = uuid.uuid4().hex
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        status = int(os.environ.get("HEALTH_STATUS", "200")) if self.path == "/health" else 200
        shown = ("PORT", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "MODEL")
        body = {"pid": os.getpid(), "launch": LAUNCH, "env": {k: os.environ.get(k) for k in shown}}
        body = json.dumps(body)
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body.encode())
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("0.0.0.0", int(os.environ["PORT"])), H)
print("serving on", os.environ["PORT"], flush=True)
server.serve_forever()
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve_payload(port: int, **env) -> dict:
    return {
        "argv": ["python3", "-c", SERVER],
        "env": env,
        "serve": {"port": port, "readiness_path": "/health"},
    }


def listener(port: int) -> int | None:
    """The pid, as this machine sees it, of the process listening on ``port``: in the node's
    network namespace or in a confined member's own (R19, where its served port is mapped to
    the same port), whose pid the member knows only in its PID namespace (R11)."""
    sockets: dict[str, None] = {}
    seen_tables: set[tuple[int, int]] = set()
    pids = sorted(int(path.name) for path in Path("/proc").glob("[0-9]*"))
    for pid in pids:
        try:
            namespace = os.stat(f"/proc/{pid}/ns/net")
        except OSError:
            continue
        if (namespace.st_dev, namespace.st_ino) in seen_tables:
            continue
        seen_tables.add((namespace.st_dev, namespace.st_ino))
        for table in ("tcp", "tcp6"):
            try:
                lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    sockets[f"socket:[{fields[9]}]"] = None  # LISTEN
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in sockets:
                    return pid
            except OSError:
                continue
    return None


def get(port: int, path: str = "/") -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return json.loads(response.read())


def until(what: str, check, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"not {what} within {timeout}s")
