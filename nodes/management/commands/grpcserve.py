"""``manage.py grpcserve``: the control gateway, over mutual TLS, on grpc.aio.

django-grpc-framework's own ``grpcrunserver`` cannot start on Django 5 and
serves only insecure ports; this serves its Service classes with TLS instead.
"""

import asyncio
import logging
import os
import signal

import grpc
from django.conf import settings
from django.core.management.base import BaseCommand
from django_grpc_framework.settings import grpc_settings
from prometheus_client import REGISTRY

from nodes import pki
from nodes.gateway import Gateway, memory, replica_name
from nodes.gateway.metrics import GatewayCollector
from tuneplane.metrics import serve_metrics_on

STOP_GRACE_SECONDS = 5
logger = logging.getLogger("tuneplane.gateway")
GATEWAY_CONN_MAX_AGE = 300
# grpc core holds a call whose headers have arrived until the application asks for it, and
# grpc.aio asks for one at a time. Past 1,000 held calls (core's default) core ends new ones
# at random with CANCELLED, and every one past 3,000 (grpc 1.85's pending-request backlog
# protector); one held for 30 s it ends too. In a reconnect storm on a busy machine that
# sent thousands of nodes back through another TLS handshake each, which made the machine
# busier still (issue 20). A held call is a stream the replica would hold anyway: here it
# waits its turn, up to 5 minutes.
PENDING_CALLS = 100_000
PENDING_SECONDS = 300
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", 1024 * 1024),
    # No SO_REUSEPORT: two processes on one address would share a replica name, and
    # the second to start would close the first's sessions (control.gateway_started).
    ("grpc.so_reuseport", 0),
    ("grpc.server.max_pending_requests", PENDING_CALLS),
    ("grpc.server.max_pending_requests_hard_limit", PENDING_CALLS),
    ("grpc.server_max_unrequested_time_in_server", PENDING_SECONDS),
]


def server_credentials() -> grpc.ServerCredentials:
    directory = pki.pki_dir()
    return grpc.ssl_server_credentials(
        [((directory / "gateway.key").read_bytes(), (directory / "gateway.pem").read_bytes())],
        root_certificates=pki.load_ca().pem.encode(),
        require_client_auth=True,
    )


def serve_metrics(bind: str, gateway: Gateway) -> None:
    """This replica's metrics over plain HTTP on ``bind``: its own process's figures and what
    it holds (GatewayCollector). Bind it where only Prometheus reaches."""
    REGISTRY.register(GatewayCollector(gateway))
    try:
        serve_metrics_on(bind, REGISTRY)
    except (OSError, ValueError) as error:  # the gateway itself serves on: metrics are no gate
        logger.error("gateway metrics not served on %s: %s", bind, error)


class Command(BaseCommand):
    help = "Serve NodeControl and grpc.health.v1 with client certificates required."

    def add_arguments(self, parser):
        parser.add_argument(
            "--bind",
            default=settings.TUNEPLANE_GATEWAY_BIND,
            help="HOST:PORT (TUNEPLANE_GATEWAY_BIND).",
        )
        parser.add_argument(
            "--metrics-bind",
            default=settings.TUNEPLANE_GATEWAY_METRICS_BIND,
            help="HOST:PORT to serve Prometheus metrics on, plain HTTP "
            "(TUNEPLANE_GATEWAY_METRICS_BIND; default: none).",
        )

    def handle(self, *args, bind, metrics_bind, **options):
        settings.TUNEPLANE_GATEWAY_BIND = bind
        self.metrics_bind = metrics_bind
        if "TUNEPLANE_DB_CONN_MAX_AGE" not in os.environ:
            # A gateway's few database threads live as long as it does: keep their
            # connections instead of opening one per call.
            settings.DATABASES["default"]["CONN_MAX_AGE"] = GATEWAY_CONN_MAX_AGE
        if not (pki.pki_dir() / "gateway.pem").exists():
            host = bind.rsplit(":", 1)[0].strip("[]") or "127.0.0.1"
            pki.issue_server_certificate(sorted({host, "127.0.0.1", "localhost"}))
        # Before grpc's threads and the database threads start.
        memory.limit_arenas(settings.TUNEPLANE_GATEWAY_MALLOC_ARENAS)
        asyncio.run(self._serve(bind))

    async def _serve(self, bind: str) -> None:
        server = grpc.aio.server(options=SERVER_OPTIONS)
        gateway = Gateway(name=replica_name(bind))
        grpc_settings.ROOT_HANDLERS_HOOK(server, gateway)
        server.add_secure_port(bind, server_credentials())
        await server.start()
        if self.metrics_bind:
            serve_metrics(self.metrics_bind, gateway)
        background = [asyncio.create_task(work) for work in gateway.background()]
        memory.time_pauses()
        frozen = memory.freeze_start_up()
        trimmer = memory.Trimmer()
        trimmer.start()
        stopped = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stopped.set)
        self.stdout.write(f"gateway serving NodeControl on {bind} (mTLS)")
        self.stdout.flush()
        # After the ready line, which whoever started the gateway waits for first.
        logger.info("%d objects of start-up left out of garbage collection", frozen)
        await stopped.wait()
        await server.stop(STOP_GRACE_SECONDS)
        for task in background:
            task.cancel()
        await gateway.stopped()
        trimmer.stop()
        self.stdout.write("gateway stopped")
