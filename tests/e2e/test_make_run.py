"""`make run`: the console comes up on its defaults, takes the product page's
request, prints the admin login once, stops everything on Ctrl-C — and never
creates a Fleet, on a first start or any restart (F6)."""

import json
import re
import socket
import stat
import subprocess
import urllib.request
import uuid
from pathlib import Path

from .console import ROOT, Console, console_env, free_port, processes_with_env

PRODUCT_PAGE_BODY = {
    "id": "gpu-lab",
    "kind": "node",
    "delivery": "shared-mount",
    "capabilities": ["train", "serve"],
}


def call(method, url, token, body=None):
    request = urllib.request.Request(
        url,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def fleet_count(base, token) -> int:
    status, body = call("GET", f"{base}/api/fleets", token)
    assert status == 200, body
    return json.loads(body)["count"]


def made_private(var: Path, base: str) -> None:
    """R23, as `make run` leaves it: not in debug mode, yet the admin's static files served;
    an error page that shows no settings; var/ 0600 files in 0700 dirs; /metrics answering
    only the token it made (no allow-list set: loopback is no scraper)."""
    with urllib.request.urlopen(f"{base}/static/admin/css/base.css", timeout=10) as css:
        assert css.status == 200
    assert call("GET", f"{base}/no-such-page", "")[0] == 404
    status, body = call("GET", f"{base}/api/training-jobs/1/logs?offset=9223372036854775808", "")
    assert status == 401 and b"DATABASE" not in body and b"SECRET" not in body
    modes = {
        path: stat.S_IMODE(path.lstat().st_mode)
        for path in [var, *var.rglob("*")]
        if not path.is_symlink()
    }
    loose = {p: oct(m) for p, m in modes.items() if m != (0o700 if p.is_dir() else 0o600)}
    assert not loose, loose
    assert call("GET", f"{base}/metrics", "")[0] == 403
    token = (var / "metrics-token").read_text().strip()
    assert call("GET", f"{base}/metrics", token)[0] == 200


def test_F6_console_starts_serves_and_stops_and_never_makes_a_fleet(tmp_path, empty_database):
    marker = f"tuneplane-e2e-{uuid.uuid4().hex}"
    env = console_env(tmp_path, DATABASE_URL=empty_database, TUNEPLANE_E2E_MARKER=marker)
    env.pop("TUNEPLANE_METRICS_ALLOW", None)  # `make run` as a newcomer starts it
    port = free_port()
    base = f"http://127.0.0.1:{port}"

    console = Console(env, port)
    try:
        console.wait_for("Tuneplane console is up")
        login = re.findall(
            r"Admin login, shown this once: username (\S+)  password (\S+)", console.output
        )
        assert len(login) == 1 and login[0][0] == "admin"
        # What README tells a newcomer right after the first start: no Django outside .venv.
        made = subprocess.run(
            ["make", "--no-print-directory", "-s", "token", "USER=admin"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert made.returncode == 0 and "shown this once" in made.stderr, made.stderr
        token = made.stdout.strip()
        assert token.startswith("tpa_") and "\n" not in token, made.stdout
        assert fleet_count(base, token) == 0
        status, body = call("POST", f"{base}/api/fleets", token, PRODUCT_PAGE_BODY)
        assert status == 201, body
        assert json.loads(body)["delivery"] == "shared-mount"
        assert call("DELETE", f"{base}/api/fleets/gpu-lab", token)[0] == 204
        with urllib.request.urlopen(f"{base}/admin/login/", timeout=10) as page:
            assert b"Tuneplane console" in page.read()
        made_private(tmp_path, base)
        console.wait_for("gateway serving NodeControl")
        gateway_host, gateway_port = console.gateway.rsplit(":", 1)
        socket.create_connection((gateway_host, int(gateway_port)), timeout=5).close()
    finally:
        code = console.stop()
    assert code == 0, console.output[-3000:]
    assert "Stopped." in console.output
    assert processes_with_env(marker) == [], "a process outlived Ctrl-C"

    again = Console(env, port)
    try:
        again.wait_for("Tuneplane console is up")
        assert "shown this once" not in again.output
        assert "existing superuser" in again.output
        assert fleet_count(base, token) == 0
    finally:
        assert again.stop() == 0
    assert processes_with_env(marker) == []
