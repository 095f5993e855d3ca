"""A bare grpc.aio NodeControl for `make bench`: the gateway's TLS, none of its work.

The baseline the gateway is compared with: same grpc.aio, same server options,
same mutual TLS (the gateway's certificate and key, client certificates from
the console CA required), and a ``Connect`` that answers Hello with a Welcome
and each Heartbeat with its ack — no identity check, no database, no Django::

    python -m tests.bench.echo_server --bind 127.0.0.1:8444 --pki-dir var/pki

Prints one ready line, then serves until SIGTERM or SIGINT.
"""

import argparse
import asyncio
import signal
from pathlib import Path

import grpc

from nodes.agent.proto import control_pb2 as pb
from nodes.agent.proto import control_pb2_grpc
from tests.bench.gateway_load import raise_fd_limit

# As grpcserve's server, so that only what the gateway does differs.
SERVER_OPTIONS = [("grpc.max_receive_message_length", 1024 * 1024)]
STOP_GRACE_SECONDS = 5


class EchoControl(control_pb2_grpc.NodeControlServicer):
    async def Connect(self, request_iterator, context):
        async for message in request_iterator:
            kind = message.WhichOneof("body")
            if kind == "hello":
                yield pb.ControlMessage(
                    welcome=pb.Welcome(
                        session_id="echo", heartbeat_interval_seconds=10, lease_ttl_seconds=30
                    )
                )
            elif kind == "heartbeat":
                yield pb.ControlMessage(
                    heartbeat_ack=pb.HeartbeatAck(sequence=message.heartbeat.sequence)
                )


def server_credentials(pki_dir: Path) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials(
        [((pki_dir / "gateway.key").read_bytes(), (pki_dir / "gateway.pem").read_bytes())],
        root_certificates=(pki_dir / "ca.pem").read_bytes(),
        require_client_auth=True,
    )


async def serve(bind: str, pki_dir: Path) -> None:
    server = grpc.aio.server(options=SERVER_OPTIONS)
    control_pb2_grpc.add_NodeControlServicer_to_server(EchoControl(), server)
    server.add_secure_port(bind, server_credentials(pki_dir))
    await server.start()
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopped.set)
    print(f"echo serving NodeControl on {bind} (mTLS)", flush=True)
    await stopped.wait()
    await server.stop(STOP_GRACE_SECONDS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bind", required=True, help="HOST:PORT")
    parser.add_argument(
        "--pki-dir",
        required=True,
        type=Path,
        help="holds ca.pem, gateway.pem and gateway.key (TUNEPLANE_PKI_DIR)",
    )
    args = parser.parse_args()
    raise_fd_limit()
    asyncio.run(serve(args.bind, args.pki_dir))


if __name__ == "__main__":
    main()
