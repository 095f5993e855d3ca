"""A local stand-in for a Kubernetes API server: it replays stored responses and records requests.

No real API server can run on these machines. The bodies in ``kube_responses/`` are in the
API's own formats (a v1 NodeList as kubelets and GPU feature discovery fill it, KubeRay RayJobs
as the API server returns them, ``Status`` errors), so the official client decodes them exactly
as it would decode a real server's; what the client sent is kept for tests to check.
"""

import json
import threading
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

RESPONSES = Path(__file__).parent / "kube_responses"

# What the API server says for a path it does not serve.
NOT_FOUND = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "the server could not find the requested resource",
    "reason": "NotFound",
    "details": {},
    "code": 404,
}


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # names in lower case
    body: object  # the decoded JSON body, or None


class KubeReplay:
    """Serves, on 127.0.0.1, the response each test chose for each method and path."""

    def __init__(self):
        self.requests: list[Request] = []
        self._routes: dict[tuple[str, str], tuple[int, bytes]] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.block_on_close = False  # a client's idle keep-alive must not hold us up
        self._server.replay = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def serve(self, method: str, path: str, response: str | dict, status: int = 200):
        """Answer ``method path`` with a file of kube_responses/ (by name) or with a body."""
        body = (
            (RESPONSES / response).read_bytes()
            if isinstance(response, str)
            else (json.dumps(response).encode())
        )
        self._routes[(method, path)] = (status, body)

    def answer(self, method: str, path: str) -> tuple[int, bytes]:
        return self._routes.get((method, path), (404, json.dumps(NOT_FOUND).encode()))

    def __enter__(self) -> "KubeReplay":
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the API server speaks

    def do_GET(self):
        replay = self.server.replay
        target = urlsplit(self.path)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        replay.requests.append(
            Request(
                method=self.command,
                path=target.path,
                query=target.query,
                headers={name.lower(): value for name, value in self.headers.items()},
                body=json.loads(raw) if raw else None,
            )
        )
        status, body = replay.answer(self.command, target.path)
        self.send_response(status)
        self.send_header("Audit-Id", str(uuid.uuid4()))
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def log_message(self, format, *args):
        """Silent: a failing test shows ``requests``, which says more than an access log."""
