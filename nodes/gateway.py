"""The gRPC NodeControl service, served by ``manage.py grpcserve`` over mutual TLS on grpc.aio.

Thin: it reads who the peer is from its certificate, translates protobuf to the
control services (nodes.control) and maps their errors to status codes in one
place. Heartbeats only mark a lease in memory; ``LeaseBatcher`` writes them.
"""

import asyncio
import inspect
import logging
import socket
from dataclasses import dataclass
from functools import update_wrapper

import grpc
from asgiref.sync import sync_to_async
from cryptography import x509
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone
from django_grpc_framework.services import Service, not_implemented
from django_grpc_framework.signals import grpc_request_finished, grpc_request_started
from google.protobuf.json_format import MessageToDict

from tuneplane.errors import ApplicationError, ValidationFailed

from . import control
from .agent.proto import control_pb2 as pb
from .pki import NODE_URI_PREFIX

logger = logging.getLogger("tuneplane.gateway")

HELLO_TIMEOUT_SECONDS = 10
_STATUS = {403: grpc.StatusCode.PERMISSION_DENIED, 400: grpc.StatusCode.INVALID_ARGUMENT,
           404: grpc.StatusCode.NOT_FOUND, 409: grpc.StatusCode.FAILED_PRECONDITION}


class AsyncService(Service):
    """django-grpc-framework's Service, with handlers grpc.aio can await.

    The framework's own ``as_servicer`` wraps methods in plain functions and
    fires ``grpc_request_finished`` when a streaming handler returns its
    generator — before the stream has run. Here the two signals surround the
    whole call, and async-generator methods stay async generators.
    """

    @classmethod
    def as_servicer(cls, **initkwargs):
        super().as_servicer(**initkwargs)  # the framework's checks of initkwargs

        def bind(action, request, context):
            service = cls(**initkwargs)
            service.request, service.context, service.action = request, context, action
            return getattr(service, action)

        class Servicer:
            def __getattr__(self, action):
                method = getattr(cls, action, None)
                if method is None:
                    return not_implemented
                if inspect.isasyncgenfunction(method):
                    async def handler(request, context):
                        await grpc_request_started.asend(sender=handler, request=request,
                                                         context=context)
                        try:
                            async for reply in bind(action, request, context)(request, context):
                                yield reply
                        finally:
                            await grpc_request_finished.asend(sender=handler)
                else:
                    async def handler(request, context):
                        await grpc_request_started.asend(sender=handler, request=request,
                                                         context=context)
                        try:
                            return await bind(action, request, context)(request, context)
                        finally:
                            await grpc_request_finished.asend(sender=handler)
                update_wrapper(handler, method)
                return handler

        return Servicer()


@dataclass(frozen=True)
class Peer:
    node_id: str
    serial: str


def peer_of(context) -> Peer | None:
    """The node named by the verified client certificate; None if there is none."""
    pem = (context.auth_context().get("x509_pem_cert") or [None])[0]
    if not pem:
        return None
    cert = x509.load_pem_x509_certificate(pem)
    try:
        uris = cert.extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        return None
    ids = [uri[len(NODE_URI_PREFIX):] for uri in uris if uri.startswith(NODE_URI_PREFIX)]
    return Peer(node_id=ids[0], serial=format(cert.serial_number, "x")) if len(ids) == 1 else None


class LeaseBatcher:
    """Collects heartbeats and renews their leases in one batch per flush interval."""

    def __init__(self):
        self.pending: dict[str, object] = {}

    def touch(self, session_id: str) -> None:
        self.pending[session_id] = timezone.now()

    def _flush_sync(self, batch) -> None:
        try:
            control.leases_renew(batch)
        finally:
            close_old_connections()

    async def flush(self) -> None:
        batch, self.pending = self.pending, {}
        if batch:
            await sync_to_async(self._flush_sync, thread_sensitive=True)(batch)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(settings.TUNEPLANE_HEARTBEAT_FLUSH_INTERVAL)
            try:
                await self.flush()
            except Exception:  # a failed flush is retried with the next batch's timestamps
                logger.exception("lease flush failed")


class Streams:
    """The streams this replica holds, by node: a newer one closes the older."""

    def __init__(self):
        self.outboxes: dict[str, asyncio.Queue] = {}

    def take(self, node_id: str, outbox: asyncio.Queue) -> None:
        older = self.outboxes.get(node_id)
        if older is not None:
            older.put_nowait(pb.ControlMessage(close=pb.Close(reason="replaced by a newer stream")))
            older.put_nowait(None)
        self.outboxes[node_id] = outbox

    def release(self, node_id: str, outbox: asyncio.Queue) -> None:
        if self.outboxes.get(node_id) is outbox:
            del self.outboxes[node_id]


def _db(function):
    """Run a control service in Django's thread, closing stale connections after."""
    def call(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        finally:
            close_old_connections()
    return sync_to_async(call, thread_sensitive=True)


def inventory_from(report: pb.InventoryReport) -> dict:
    data = MessageToDict(report, preserving_proto_field_name=True)
    data["cards"] = [{"name": c.name, "count": c.count} for c in report.cards]
    data["storage_root_visible"] = report.storage_root_visible
    for key in ("cpu_budget", "memory_budget_bytes"):
        data[key] = int(data[key]) if key in data else None
    return data


class NodeControlService(AsyncService):
    gateway_name = socket.gethostname()
    streams = Streams()
    batcher = LeaseBatcher()

    async def Connect(self, request_iterator, context):
        peer = peer_of(context)
        if peer is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "a node certificate is required")
        try:
            first = await asyncio.wait_for(anext(request_iterator), HELLO_TIMEOUT_SECONDS)
        except (asyncio.TimeoutError, StopAsyncIteration):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the stream opens with Hello")
        if first.WhichOneof("body") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the stream opens with Hello")
        if first.hello.node_id != peer.node_id:
            logger.warning("node %s sent a Hello naming %s; refused", peer.node_id,
                           first.hello.node_id[:64])
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                "Hello names a node other than the certificate's")
        try:
            session = await _db(control.session_open)(
                node_id=peer.node_id, serial=peer.serial,
                gateway=f"{self.gateway_name}:{settings.TUNEPLANE_GATEWAY_BIND}",
                agent_version=first.hello.agent_version)
        except ApplicationError as error:
            logger.warning("node %s refused: %s", peer.node_id, error.message)
            await context.abort(_STATUS.get(error.status, grpc.StatusCode.PERMISSION_DENIED),
                                error.message)
        outbox: asyncio.Queue = asyncio.Queue()
        self.streams.take(peer.node_id, outbox)
        reader = asyncio.create_task(self._read(request_iterator, peer, session, outbox))
        reason = "stream ended"
        try:
            yield pb.ControlMessage(welcome=pb.Welcome(
                session_id=str(session.id),
                heartbeat_interval_seconds=settings.TUNEPLANE_HEARTBEAT_INTERVAL,
                lease_ttl_seconds=settings.TUNEPLANE_LEASE_TTL))
            while (message := await outbox.get()) is not None:
                if message.WhichOneof("body") == "close":
                    reason = message.close.reason
                yield message
        finally:
            reader.cancel()
            self.streams.release(peer.node_id, outbox)
            await _db(control.session_close)(session_id=session.id, reason=reason)

    async def _read(self, request_iterator, peer: Peer, session, outbox) -> None:
        last_sequence = -1
        try:
            async for message in request_iterator:
                kind = message.WhichOneof("body")
                if kind == "heartbeat":
                    if message.heartbeat.sequence <= last_sequence:
                        logger.warning("node %s: heartbeat %d after %d ignored", peer.node_id,
                                       message.heartbeat.sequence, last_sequence)
                        continue
                    last_sequence = message.heartbeat.sequence
                    self.batcher.touch(str(session.id))
                    outbox.put_nowait(pb.ControlMessage(
                        heartbeat_ack=pb.HeartbeatAck(sequence=last_sequence)))
                elif kind == "inventory":
                    try:
                        await _db(control.node_report_inventory)(
                            node_id=peer.node_id, inventory=inventory_from(message.inventory))
                    except ValidationFailed as error:
                        logger.warning("node %s: inventory refused: %s", peer.node_id,
                                       error.message)
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            pass
        finally:
            outbox.put_nowait(None)

    async def RotateCredential(self, request, context):
        peer = peer_of(context)
        if peer is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "a node certificate is required")
        try:
            issued = await _db(control.credential_rotate)(node_id=peer.node_id,
                                                          serial=peer.serial, csr=request.csr)
        except ApplicationError as error:
            logger.warning("node %s: rotation refused: %s", peer.node_id, error.message)
            await context.abort(_STATUS.get(error.status, grpc.StatusCode.PERMISSION_DENIED),
                                error.message)
        return pb.RotateCredentialResponse(certificate=issued.pem,
                                           credential_expires_at=issued.not_after.isoformat())
