"""``tuneplane logs -f`` against a console played in-process (httpx's mock transport): a
member that writes more than one read carries, a node that stops answering for a moment,
and the member's end — the output comes whole, once, in order, and the command exits with
the member's exit code only after the read that brought the rest."""

import httpx
import pytest
from tuneplane_cli import main
from tuneplane_cli.client import Client
from tuneplane_cli.config import Config

from .conftest import tuneplane


class Member:
    """A job's one member: what it has written, and whether it has ended (with its code)."""

    def __init__(self):
        self.output = b""
        self.state, self.exit_code = "running", None
        self.reads = []

    def job(self) -> dict:
        member = {"rank": 0, "node": "n-1", "state": self.state, "exit_code": self.exit_code}
        return {"id": 5, "state": self.state, "attempts": [{"number": 1, "members": [member]}]}

    def logs(self, params) -> dict:
        limit = int(params.get("tail_bytes", 65536))
        if "offset" in params:
            start = min(int(params["offset"]), len(self.output))
        else:
            start = max(len(self.output) - limit, 0)
        data = self.output[start : start + limit]
        self.reads.append((params.get("offset"), len(data)))
        return {
            "attempt": 1,
            "rank": 0,
            "node": "n-1",
            "tail_bytes": limit,
            "offset": start,
            "next_offset": start + len(data),
            "truncated": False,
            "output": data.decode(),
        }


@pytest.fixture
def member(monkeypatch):
    played = Member()
    script = iter(
        [
            lambda: None,
            lambda: setattr(played, "output", played.output + b"a" * 150_000),
            lambda: "unavailable",  # the node does not answer, once
            lambda: setattr(played, "output", played.output + b"\nlast line\n"),
            lambda: played.__dict__.update(state="failed", exit_code=3),
        ]
    )

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/training-jobs/5":
            step = next(script, lambda: None)()
            if step == "unavailable":
                played.unavailable = True
            return httpx.Response(200, json=played.job())
        if getattr(played, "unavailable", False):
            played.unavailable = False
            body = {"error": {"code": "node_not_connected", "message": "Node 'n-1' is not"}}
            return httpx.Response(503, json=body)
        return httpx.Response(200, json=played.logs(dict(request.url.params)))

    transport = httpx.MockTransport(handle)
    config = Config(server="http://console.test", token="t")
    monkeypatch.setattr(main, "client", lambda: Client(config, transport=transport))
    return played


def test_follow_reads_everything_once_in_order_and_exits_with_the_members_code(member):
    result = tuneplane("logs", "training-job", 5, "-f", "--interval", "0.1")
    assert result.stdout == "a" * 150_000 + "\nlast line\n"
    assert result.exit_code == 3
    # The tail first (nothing yet), then by offset: each full read followed at once by the
    # next, each from where the last ended, and one read after the end that brings nothing.
    total = 150_000 + len("\nlast line\n")
    assert member.reads == [
        (None, 0),
        ("0", 65536),
        ("65536", 65536),
        ("131072", total - 131072),
        (str(total), 0),
    ]
