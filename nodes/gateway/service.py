"""The gRPC NodeControl service, served by ``manage.py grpcserve`` over mutual TLS on grpc.aio.

Thin: it reads who the peer is from its certificate, translates protobuf to the control
services (nodes.services) and maps their errors to status codes in one place. Heartbeats
only mark a lease in memory; the replica's ``LeaseBatcher`` writes them. Everything a
replica holds is its ``Gateway``'s, handed to the service by ``as_servicer(gateway=...)``.
"""

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import NoReturn

import grpc
from cryptography import x509
from django.conf import settings

from tuneplane.errors import ApplicationError, ValidationFailed

from ..agent import wire
from ..agent.proto import control_pb2 as pb
from ..pki import NODE_URI_PREFIX
from ..services import commands, control, cordons, logs, sessions
from .aio import AsyncService
from .metrics import ACK_LATENCY, HEARTBEATS, HELLOS, OPENS_REFUSED, STREAMS_CLOSED, close_reason
from .process import Gateway
from .storage_watch import StorageWatch
from .streams import Stream

logger = logging.getLogger("tuneplane.gateway")

# Messages of one stream waiting for the database; beyond this, the stream is closed.
STORE_QUEUE = 256
# Command states one Hello may carry (L5): a node runs far fewer; more closes the stream.
MAX_HELLO_COMMANDS = 1000
STORAGE_OBSERVED = "storage observation"  # on a stream's database queue: StorageWatch's turn
_STATUS = {
    403: grpc.StatusCode.PERMISSION_DENIED,
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


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
            x509.SubjectAlternativeName
        ).value.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        return None
    ids = [uri[len(NODE_URI_PREFIX) :] for uri in uris if uri.startswith(NODE_URI_PREFIX)]
    return Peer(node_id=ids[0], serial=format(cert.serial_number, "x")) if len(ids) == 1 else None


async def refuse(context, reason: str, code: grpc.StatusCode, details: str) -> NoReturn:
    """End an open before its Welcome, counted by ``reason`` (a few fixed ones, never free text)."""
    OPENS_REFUSED.labels(reason).inc()
    await context.abort(code, details)


class NodeControlService(AsyncService):
    gateway: Gateway | None = None  # given by as_servicer(gateway=...)

    async def Connect(self, request_iterator, context):
        peer = peer_of(context)
        if peer is None:
            await refuse(
                context,
                "no node certificate",
                grpc.StatusCode.UNAUTHENTICATED,
                "a node certificate is required",
            )
        timeout = settings.TUNEPLANE_HELLO_TIMEOUT
        try:
            first = await asyncio.wait_for(anext(request_iterator), timeout)
        except TimeoutError:
            await refuse(
                context,
                "hello timeout",
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the stream opens with Hello, sent within {timeout} s (TUNEPLANE_HELLO_TIMEOUT)",
            )
        except StopAsyncIteration:
            await refuse(
                context, "no hello", grpc.StatusCode.INVALID_ARGUMENT, "the stream opens with Hello"
            )
        if first.WhichOneof("body") != "hello":
            await refuse(
                context, "no hello", grpc.StatusCode.INVALID_ARGUMENT, "the stream opens with Hello"
            )
        hello = first.hello
        if hello.node_id != peer.node_id:
            logger.warning(
                "node %s sent a Hello naming %s; refused", peer.node_id, hello.node_id[:64]
            )
            await refuse(
                context,
                "hello names another node",
                grpc.StatusCode.PERMISSION_DENIED,
                "Hello names a node other than the certificate's",
            )
        if len(hello.commands) > MAX_HELLO_COMMANDS:
            logger.warning(
                "node %s sent a Hello with %d command states; refused",
                peer.node_id,
                len(hello.commands),
            )
            await refuse(
                context,
                "too many command states",
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"a Hello carries at most {MAX_HELLO_COMMANDS} command states",
            )
        try:
            reported = [commands.Reported.from_wire(c) for c in hello.commands]
            opened = await self.gateway.sessions.open(
                sessions.Hello(peer.node_id, peer.serial, hello.agent_version, reported)
            )
        except ApplicationError as error:
            logger.warning("node %s refused: %s", peer.node_id, error.message)
            await refuse(
                context,
                "refused by the console",
                _STATUS.get(error.status, grpc.StatusCode.PERMISSION_DENIED),
                error.message,
            )
        HELLOS.inc()
        session = opened.session
        # Until this stream stores a report, the one the console holds (if the Welcome names
        # it, the node need not resend it, and its beats carrying it keep it fresh).
        stream = Stream(peer.node_id, str(session.id), inventory_digest=opened.inventory_digest)
        # L5: what the node already knows is never sent on this stream, even by a poll or a
        # nudge that read the command as pending before its Hello's reconcile settled it.
        stream.sent.update(item.command_id for item in reported)
        self.gateway.streams.take(stream)
        reader = None
        reason = "stream ended"
        try:
            # Reading starts before the Welcome is written: a write the transport completes
            # late must not leave the node's first heartbeats unread.
            stream.welcomed, stream.last_beat = True, time.monotonic()
            reader = asyncio.create_task(self._read(request_iterator, stream, opened))
            stream.deliver(opened.pending)
            yield pb.ControlMessage(
                welcome=pb.Welcome(
                    session_id=stream.session_id,
                    heartbeat_interval_seconds=settings.TUNEPLANE_HEARTBEAT_INTERVAL,
                    lease_ttl_seconds=settings.TUNEPLANE_LEASE_TTL,
                    telemetry_interval_seconds=settings.TUNEPLANE_TELEMETRY_INTERVAL,
                    inventory_digest=opened.inventory_digest,
                )
            )
            while (message := await stream.outbox.get()) is not None:
                kind = message.WhichOneof("body")
                if kind == "close":
                    reason = message.close.reason
                elif kind == "heartbeat_ack" and stream.acks_queued:
                    ACK_LATENCY.observe(time.monotonic() - stream.acks_queued.popleft())
                yield message
        finally:
            if reader is not None:
                reader.cancel()
            self.gateway.streams.release(stream)
            if peer.node_id not in self.gateway.streams.by_node:
                self.gateway.telemetry.forget(peer.node_id)
            STREAMS_CLOSED.labels(close_reason(reason)).inc()
            # Shielded: when the peer has gone, grpc cancels this handler, and a close still
            # queued for the database thread would otherwise be dropped with it.
            await asyncio.shield(self.gateway.sessions.close(str(session.id), reason))

    async def _read(self, request_iterator, stream: Stream, opened: sessions.Opened) -> None:
        """Takes the node's messages as they arrive. A heartbeat is taken here and now (its
        time, its lease, its ack), so a stream is never judged silent because the database
        threads are busy; what needs the database goes, in order, to ``_store``."""
        node_id = stream.node_id
        last_sequence = -1
        work: asyncio.Queue = asyncio.Queue()
        storage = StorageWatch(
            lambda: work.put_nowait(STORAGE_OBSERVED),
            watching=opened.watch_storage,
            recorded=opened.storage_root_visible,
        )
        store = asyncio.create_task(self._store(stream, work, storage))
        self.gateway.storing.add(store)
        store.add_done_callback(self.gateway.storing.discard)
        try:
            async for message in request_iterator:
                kind = message.WhichOneof("body")
                if kind == "heartbeat":
                    beat = message.heartbeat
                    if beat.sequence <= last_sequence:
                        # Dropped, and said so: the ack names the last sequence taken, not
                        # this one, and nothing is renewed (control.proto, Heartbeat).
                        logger.warning(
                            "node %s: heartbeat %d after %d dropped; its lease not renewed",
                            node_id,
                            beat.sequence,
                            last_sequence,
                        )
                        stream.acks_queued.append(time.monotonic())
                        stream.outbox.put_nowait(
                            pb.ControlMessage(heartbeat_ack=pb.HeartbeatAck(sequence=last_sequence))
                        )
                        continue
                    last_sequence = beat.sequence
                    stream.last_beat = time.monotonic()
                    stream.acks_queued.append(stream.last_beat)
                    HEARTBEATS.inc()
                    self.gateway.batcher.touch(
                        stream,
                        inventory_unchanged=bool(beat.inventory_digest)
                        and beat.inventory_digest == stream.inventory_digest,
                    )
                    stream.outbox.put_nowait(
                        pb.ControlMessage(heartbeat_ack=pb.HeartbeatAck(sequence=last_sequence))
                    )
                    # At most one storage observation waits for the database at a time,
                    # and it is counted against STORE_QUEUE with the reports.
                    storage.observe(beat.storage_root_visible)
                elif kind == "telemetry":
                    # Kept, the newest per node, for the next batched write: never queued
                    # for the database one by one, never waited for (gateway/telemetry.py).
                    self.gateway.telemetry.take(node_id, message.telemetry)
                elif kind in ("inventory", "command_update", "log_tail"):
                    if work.qsize() >= STORE_QUEUE:
                        # Reading on would grow the queue without bound; waiting would leave
                        # heartbeats unread. The node is told, and tells it all again.
                        logger.warning(
                            "node %s: %d reports waiting for the database; closing its stream",
                            node_id,
                            work.qsize(),
                        )
                        self.gateway.streams.close(
                            node_id,
                            "too many reports waiting for the database",
                            session_id=stream.session_id,
                        )
                        break
                    work.put_nowait(message)
                else:  # a second Hello, or nothing at all: the stream already has both
                    logger.warning("node %s: unexpected %s ignored", node_id, kind)
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            pass
        finally:
            storage.stop()
            # What the node said before it went is stored still: the store task ends when it
            # reaches this mark, whatever happens to the stream meanwhile.
            work.put_nowait(None)
            stream.outbox.put_nowait(None)

    async def _store(self, stream: Stream, work: asyncio.Queue, storage: StorageWatch) -> None:
        """The database work of one stream's messages, one at a time, in arrival order."""
        node_id = stream.node_id
        while (message := await work.get()) is not None:
            observed = message is STORAGE_OBSERVED
            kind = "storage observation" if observed else message.WhichOneof("body")
            try:
                if observed:
                    await self.gateway.database.run(
                        cordons.node_observe_storage_root,
                        node_id=node_id,
                        visible=storage.take(),
                    )
                elif kind == "inventory":
                    report = wire.inventory_report(message.inventory)
                    if not (storage.watching and storage.reported):
                        # The stream's first report (or no watch at all): it moves the cordon.
                        storage.settled(report["storage_root_visible"])
                    else:  # later ones move it as heartbeats do, debounced
                        storage.observe(report["storage_root_visible"])
                        report["storage_root_visible"] = storage.written
                    digest = wire.inventory_digest(message.inventory)
                    as_sent = (
                        report["storage_root_visible"] == message.inventory.storage_root_visible
                    )
                    await self.gateway.database.run(
                        control.node_report_inventory,
                        node_id=node_id,
                        inventory=report,
                        # Stored as sent, it is the report the digest names.
                        digest=digest if as_sent else "",
                    )
                    stream.inventory_digest = digest
                elif kind == "log_tail":
                    tail = message.log_tail
                    await self.gateway.database.run(
                        logs.log_fetch_answer,
                        node_id=node_id,
                        request_id=tail.request_id,
                        found=tail.found,
                        data=tail.data,
                        offset=tail.offset if tail.HasField("offset") else None,
                        next_offset=tail.next_offset,
                        truncated=tail.truncated,
                    )
                else:
                    state = message.command_update.state
                    await self.gateway.database.run(
                        commands.node_command_report,
                        node_id=node_id,
                        reported=commands.Reported.from_wire(state),
                    )
            except ValidationFailed as error:
                logger.warning("node %s: %s refused: %s", node_id, kind, error.message)
            except Exception:
                # The database is away, say. Nothing is dropped quietly: the stream ends, and
                # the node's reconnect reports its commands and inventory again (L5).
                logger.exception("node %s: storing a %s failed; closing its stream", node_id, kind)
                self.gateway.streams.close(
                    node_id, f"the console could not store a {kind}", session_id=stream.session_id
                )
                return

    async def RotateCredential(self, request, context):
        peer = peer_of(context)
        if peer is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "a node certificate is required")
        try:
            issued = await self.gateway.database.run(
                control.credential_rotate, node_id=peer.node_id, serial=peer.serial, csr=request.csr
            )
        except ApplicationError as error:
            logger.warning("node %s: rotation refused: %s", peer.node_id, error.message)
            await context.abort(
                _STATUS.get(error.status, grpc.StatusCode.PERMISSION_DENIED), error.message
            )
        return pb.RotateCredentialResponse(
            certificate=issued.pem, credential_expires_at=issued.not_after.isoformat()
        )
