"""Redis away for 30 s: the API keeps serving reads and writes (joins included), and command
fan-out and the sweeps resume by themselves when it is back. A private redis-server on its
own port is stopped for real; PostgreSQL stays the record throughout."""

import shutil
import signal
import subprocess
import time

import pytest
from django.test import override_settings

from .agents import lay_out_a_joined_node, running_gateway, serve, wait_until
from .console import free_port
from .running import SHORT, sweepers
from .test_commands import connected, send, state_of

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]

OUTAGE_SECONDS = 30


class PrivateRedis:
    def __init__(self):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                shutil.which("redis-server"),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
        )
        wait_until(
            lambda: subprocess.run(
                ["redis-cli", "-p", str(self.port), "ping"], capture_output=True
            ).stdout.strip()
            == b"PONG",
            what="redis-server up",
        )

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)


@pytest.fixture
def redis_server(require_redis):
    server = PrivateRedis()
    server.start()
    yield server
    if server.process.poll() is None:
        server.kill()


def test_redis_away_for_30_seconds_loses_nothing_and_everything_resumes(
    redis_server, tmp_path, console_pki, node_fleet, mint, admin_api, anon_api
):
    from tests.conftest import H100_INVENTORY, make_csr

    node, env, _ = lay_out_a_joined_node(node_fleet, mint, tmp_path)
    caches = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": redis_server.url,
        }
    }
    # Polling slowed to a minute: after the outage, only a resubscribed gateway delivers
    # a command within seconds.
    console = {**SHORT, "REDIS_URL": redis_server.url, "TUNEPLANE_COMMAND_POLL_INTERVAL": "60"}
    with (
        override_settings(REDIS_URL=redis_server.url, CACHES=caches),
        sweepers(tmp_path, redis_server.url),
        running_gateway(tmp_path, console_pki, **console) as target,
    ):
        agent = serve(env, target, tmp_path)
        try:
            connected(node)
            redis_server.kill()
            started = time.monotonic()
            assert admin_api.get("/api/fleets").status_code == 200
            assert (
                admin_api.post("/api/fleets", {"id": "during", "kind": "node"}).status_code == 201
            )
            joined = anon_api.post(
                "/api/nodes/join",
                {
                    "token": mint(node_fleet)[1],
                    "fleet": node_fleet.id,
                    "csr": make_csr()[1],
                    "inventory": H100_INVENTORY,
                },
            )
            assert joined.status_code == 201, joined.content
            during = send(admin_api, node, ["true"])  # recorded; delivered by the poll later
            time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - started)))
            redis_server.start()
            after = send(admin_api, node, ["true"])
            wait_until(
                lambda: state_of(after) == "succeeded",
                timeout=20,
                what="fan-out through Redis again",
            )
            assert state_of(during) in ("succeeded", "pending", "running")
        finally:
            agent.send_signal(signal.SIGKILL)
            agent.wait(10)
        wait_until(
            lambda: admin_api.get(f"/api/nodes/{node.id}").json()["liveness"]["serve"] == "quiet",
            timeout=30,
            what="the sweeps running again",
        )
