"""What the agent's member tests share (tests/nodes/test_members.py, test_replicas.py, the e2e
serving tests): its cards, how a member is started and read as the agent looks at it, and a
trivial HTTP server to serve as a replica. The executor fixture is tests/nodes/conftest.py's."""

import json
import socket
import time
import urllib.request

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


# A trivial server: /health answers HEALTH_STATUS (200 unless the env says otherwise); every
# path answers its pid and the env a replica gets.
SERVER = """
import http.server, json, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        status = int(os.environ.get("HEALTH_STATUS", "200")) if self.path == "/health" else 200
        shown = ("PORT", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "MODEL")
        body = json.dumps({"pid": os.getpid(), "env": {k: os.environ.get(k) for k in shown}})
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body.encode())
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H)
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
