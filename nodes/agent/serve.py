"""``tuneplane-node serve``: hold the control stream — Hello, heartbeats, inventory, reconnect."""

import logging
import queue
import random
import socket
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import grpc
from cryptography import x509

from . import __version__, enroll, inventory, state, telemetry
from .executor import CLEANUP, STOP, Executor
from .member import containers
from .member.adoption import adopt_orphans
from .member.probing import Prober
from .proto import control_pb2 as pb
from .proto import control_pb2_grpc
from .wire import (
    LOG_TAIL_MAX,
    command_payload,
    command_state,
    inventory_digest,
    inventory_message,
    telemetry_message,
)

# How often members are looked at between heartbeats: an exit or a cleanup is reported
# within this, not a heartbeat interval later.
MEMBER_POLL_SECONDS = 1.0
LOG_RETENTION_SECONDS = 7 * 24 * 3600
# Seconds between two Telemetry samples when the console's Welcome does not say.
TELEMETRY_INTERVAL = 15


def wire_state(record) -> pb.CommandState:
    """A command's or a member's state as reported (a command has no member's fields)."""
    return command_state(
        record.command_id,
        record.state,
        record.exit_code,
        reason=record.reason,
        cleaned=getattr(record, "cleaned", False),
        confinement=getattr(record, "confinement", ""),
        ready=getattr(record, "ready", False),
        restarts=getattr(record, "restarts", 0),
        detail=getattr(record, "detail", ""),
        checkpoint_at=getattr(record, "checkpoint_at", None),
    )


logger = logging.getLogger("tuneplane-node")

BACKOFF_FIRST = 1.0
# Never waits longer than a heartbeat interval between attempts (the console's default one
# until a Welcome says otherwise). After a console outage the console holds its judgement
# for at least a lease, so every node that is up is back before silence counts against it;
# and after a gateway restart a node is back within an interval of its being ready, plus
# its queue of Hellos (issue 20: capped at the lease, 30 s, recovery followed the cap).
BACKOFF_MAX = 10.0


# A connection's TCP and TLS handshakes get this long before the attempt is given up
# (grpc's own default is 20 s). After a gateway restart every node's handshake arrives at
# once and the replica shares its cores among them all, so they finish late, together; one
# given up is begun again from nothing, which makes the storm longer (issue 20). The
# option's name is grpc's: it sets the connect timeout, not the backoff.
CONNECT_TIMEOUT_SECONDS = 60
CHANNEL_OPTIONS = [("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_SECONDS * 1000)]


def backoff_delay(attempt: int, heartbeat_interval: float) -> float:
    """Seconds before reconnect attempt ``attempt``: doubling, capped by the heartbeat
    interval, jittered downwards so a fleet does not come back in lockstep."""
    cap = min(BACKOFF_MAX, heartbeat_interval) if heartbeat_interval > 0 else BACKOFF_MAX
    return min(cap, BACKOFF_FIRST * 2 ** min(attempt, 16)) * random.uniform(0.5, 1.0)


# What the console says when this node's credential will never be taken again: the node was
# removed (D4), its credential revoked or expired (J6: a lost credential means a new token
# and a new node). Retrying cannot help; joining again as a new node does.
REFUSED_FOR_GOOD = ("is removed", "is revoked", "has expired", "no credential")
# The exit status of an agent the console refused for good.
EXIT_REFUSED = 3


def refused_for_good(code: grpc.StatusCode, details: str) -> bool:
    """Whether a stream's end is the console refusing this node for good."""
    return code == grpc.StatusCode.PERMISSION_DENIED and any(
        said in (details or "") for said in REFUSED_FOR_GOOD
    )


def how_to_join_again(identity: dict, directory: Path, why: str) -> str:
    """What an operator reads when the console refused this node for good."""
    server, fleet = identity.get("server", "URL"), identity.get("fleet", "FLEET")
    return (
        f"the console refuses node {identity.get('node_id', '?')} for good: {why}. "
        "Retrying cannot help. To join this machine again, as a new node: get a new join "
        f"token (tuneplane join-token {fleet}), move {directory} aside, then run "
        f"tuneplane-node join --server {server} --fleet {fleet} --token TOKEN, and serve again."
    )


ROTATE_AT = 2 / 3  # of the credential's lifetime
ROTATION_RETRY_SECONDS = 30


def channel_credentials(directory: Path) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=(directory / state.CA_BUNDLE).read_bytes(),
        private_key=(directory / state.KEY).read_bytes(),
        certificate_chain=(directory / state.CERTIFICATE).read_bytes(),
    )


class Agent:
    def __init__(
        self,
        *,
        directory: Path,
        target: str,
        inventory_file: str | None,
        storage_root: str | None,
        cpu_budget: int | None,
        memory_budget_bytes: int | None,
        telemetry_file: str | None = None,
        member_uids: tuple[int, int] | None = None,
        member_deny_cidrs: list[str] | None = None,
    ):
        self.directory = directory
        self.target = target
        state.settle_rotation(directory)  # a rotation a crash interrupted: finished or undone
        self.identity = state.read_identity(directory)
        self.inventory_file = inventory_file
        self.storage_root = storage_root
        self.budgets = {"cpu_budget": cpu_budget, "memory_budget_bytes": memory_budget_bytes}
        self.stopping = threading.Event()
        self.ticked = threading.Condition()
        self.call = None
        self.runtime_probe = containers.RuntimeProbe()
        self.executor = Executor(
            directory,
            devices=self.devices,
            storage_root=storage_root,
            scope=(self.identity or {}).get("node_id", "local"),
            runtime=self.runtime,
            uids=member_uids,
            deny_cidrs=member_deny_cidrs or [],
        )
        adopt_orphans(self.executor.runner)
        # What this stream has told the console of each command, to report only changes.
        self.reported: dict[str, tuple] = {}
        self.last_inventory: pb.InventoryReport | None = None
        self.heartbeat_interval = BACKOFF_MAX  # until a Welcome gives the console's
        self.telemetry_file = telemetry_file
        self.telemetry_source = None  # made by the first stream's telemetry loop
        self.host = telemetry.Host()
        self.refused = ""  # why the console refused this node for good, once it has

    def report(self) -> dict:
        if not self.inventory_file:
            return inventory.probe(
                storage_root=self.storage_root, runtime=self.runtime_probe, **self.budgets
            )[0]
        report = inventory.from_file(self.inventory_file)
        if self.storage_root:
            report["storage_root_visible"] = inventory.storage_root_visible(self.storage_root)
        return report

    def devices(self) -> list[dict]:
        """The cards a start may name: the inventory's, as last probed."""
        return self.report().get("devices") or []

    def runtime(self) -> str:
        """The container runtime a member naming an image runs under: the inventory's."""
        return containers.runtime_named(self.report().get("container_runtime"))

    def storage_root_visible(self) -> bool:
        """Probed when a storage root is configured; an inventory file may stand in for it."""
        if self.storage_root or not self.inventory_file:
            return inventory.storage_root_visible(self.storage_root)
        return bool(self.report().get("storage_root_visible"))

    def stop(self) -> None:
        self.stopping.set()
        if self.call is not None:
            self.call.cancel()

    def run(self) -> int:
        # Members are advanced (exits noticed, stops escalated, replicas restarted) and
        # replicas probed whether or not the console is reachable.
        threading.Thread(target=self._tick, daemon=True).start()
        prober = Prober(self.executor.runner)
        threading.Thread(target=prober.run, args=(self.stopping,), daemon=True).start()
        attempt = 0
        while not self.stopping.is_set():
            connected = self._stream()
            if self.refused:
                logger.error(how_to_join_again(self.identity, self.directory, self.refused))
                self.stopping.set()
                return EXIT_REFUSED
            if self.stopping.is_set():
                break
            attempt = 0 if connected else attempt + 1
            delay = backoff_delay(attempt, self.heartbeat_interval)
            logger.info("reconnecting in %.1fs", delay)
            self.stopping.wait(delay)
        logger.info("stopped")
        return 0

    def _stream(self) -> bool:
        """One stream, until it ends. Returns whether it got as far as a Welcome."""
        outgoing: queue.Queue = queue.Queue()
        self.executor.tick()  # the Hello tells what runs now
        known = self.executor.known()
        self.reported = {command.command_id: command.reported() for command in known}
        outgoing.put(
            pb.NodeMessage(
                hello=pb.Hello(
                    node_id=self.identity["node_id"],
                    agent_version=__version__,
                    commands=[wire_state(command) for command in known],
                )
            )
        )

        def requests():
            while True:
                message = outgoing.get()
                if message is None:
                    return
                yield message

        welcomed = False
        with grpc.secure_channel(
            self.target, channel_credentials(self.directory), options=CHANNEL_OPTIONS
        ) as channel:
            stub = control_pb2_grpc.NodeControlStub(channel)
            self.call = stub.Connect(requests())
            try:
                for message in self.call:
                    kind = message.WhichOneof("body")
                    if kind == "welcome":
                        welcomed = True
                        self.heartbeat_interval = message.welcome.heartbeat_interval_seconds
                        logger.info(
                            "connected to %s (session %s)", self.target, message.welcome.session_id
                        )
                        # Reconciled by the console: finished ones need not be told again
                        # (those the Hello told as they are now: a change since is told).
                        self.executor.forget_finished(list(self.reported.items()))
                        self._send_inventory(outgoing, held=message.welcome.inventory_digest)
                        threading.Thread(
                            target=self._heartbeat,
                            daemon=True,
                            args=(outgoing, message.welcome.heartbeat_interval_seconds, self.call),
                        ).start()
                        threading.Thread(
                            target=self._rotate_when_due, args=(stub,), daemon=True
                        ).start()
                        threading.Thread(
                            target=self._watch, args=(outgoing, self.call), daemon=True
                        ).start()
                        threading.Thread(
                            target=self._telemetry,
                            args=(outgoing, message.welcome.telemetry_interval_seconds, self.call),
                            daemon=True,
                        ).start()
                    elif kind == "command":
                        self._accept(message.command, outgoing)
                    elif kind == "log_request":
                        self._answer_log(message.log_request, outgoing)
                    elif kind == "close":
                        logger.info("console closed the stream: %s", message.close.reason)
            except grpc.RpcError as error:
                if not self.stopping.is_set():
                    logger.info("stream ended: %s %s", error.code().name, error.details())
                if refused_for_good(error.code(), error.details()):
                    self.refused = error.details()
            finally:
                outgoing.put(None)
        return welcomed

    def _send_inventory(
        self, outgoing: queue.Queue, *, unless_unchanged: bool = False, held: str = ""
    ) -> bool:
        """Send the inventory; with ``unless_unchanged``, only if it differs from the last;
        not if it is the one the console holds (``held``, the digest its Welcome named)."""
        message = inventory_message(self.report())
        if unless_unchanged and message == self.last_inventory:
            return False
        if held and inventory_digest(message) == held:
            self.last_inventory = message  # the beats name it: the console keeps it fresh
            return False
        if self.last_inventory is not None:
            logger.info("inventory changed; reported")
        self.last_inventory = message
        outgoing.put(pb.NodeMessage(inventory=message))
        return True

    def _accept(self, message: pb.Command, outgoing: queue.Queue) -> None:
        command = self.executor.accept(message.command_id, message.kind, command_payload(message))
        if command is not None:
            logger.info("command %s %s", command.command_id, command.state)
            self._tell(command, outgoing)
            if command.kind in (STOP, CLEANUP) and command.state != "running":
                # An answer, not work: told once, it is not carried into every later Hello
                # (which the console caps). Lost on the way, it is delivered again.
                self.executor.forget_finished([(command.command_id, command.reported())])
                self.reported.pop(command.command_id, None)

    def _answer_log(self, request: pb.LogRequest, outgoing: queue.Queue) -> None:
        asked = min(max(request.tail_bytes, 0), LOG_TAIL_MAX)  # R15: never past the cap
        offset = request.offset if request.HasField("offset") else None
        read = self.executor.log_read(request.member_id, asked, offset)
        answer = pb.LogTail(request_id=request.request_id, found=read is not None)
        if read is not None:
            answer.data, answer.offset, answer.next_offset = (
                read.data,
                read.offset,
                read.next_offset,
            )
            answer.truncated = read.truncated
        outgoing.put(pb.NodeMessage(log_tail=answer))

    def _tell(self, command, outgoing: queue.Queue) -> None:
        self.reported[command.command_id] = command.reported()
        outgoing.put(pb.NodeMessage(command_update=pb.CommandUpdate(state=wire_state(command))))

    def _report_finished(self, outgoing: queue.Queue) -> None:
        """Every change since the last report: an exit, a cleanup done, a stop escalated."""
        for command in self.executor.known():
            if self.reported.get(command.command_id) not in (None, command.reported()):
                logger.info(
                    "command %s %s (exit %s, %s%s)",
                    command.command_id,
                    command.state,
                    command.exit_code,
                    command.reason or "-",
                    ", cleaned" if getattr(command, "cleaned", False) else "",
                )
                self._tell(command, outgoing)

    def _heartbeat(self, outgoing: queue.Queue, interval: int, call) -> None:
        """Each beat probes the inventory: sent whole when it changed, else named by digest,
        which keeps the console's observation of it fresh at no extra write (L1). It beats
        for its own stream only: one outliving a reconnect would take reports into a dead
        stream's queue."""
        sequence = 0
        while not self.stopping.wait(interval) and call.is_active():
            sequence += 1
            self._send_inventory(outgoing, unless_unchanged=True)
            outgoing.put(
                pb.NodeMessage(
                    heartbeat=pb.Heartbeat(
                        sequence=sequence,
                        storage_root_visible=self.storage_root_visible(),
                        inventory_digest=inventory_digest(self.last_inventory),
                    )
                )
            )

    def _telemetry(self, outgoing: queue.Queue, interval: int, call) -> None:
        """A sample of the cards and the host every interval, for this stream, on a thread of
        its own: a slow probe never delays a heartbeat. Sent when it says something new, or
        the refresh is due (telemetry.Reporter); taken on a clock, so the refresh comes on
        time however long the probe takes."""
        if self.telemetry_source is None:
            self.telemetry_source = telemetry.source(self.telemetry_file)
        interval = interval or TELEMETRY_INTERVAL
        reporter = telemetry.Reporter(interval)
        next_at = time.monotonic()
        while call.is_active() and not self.stopping.is_set():
            try:
                sample = telemetry.sample(self.telemetry_source, self.host, self.devices())
                if reporter.due(sample, time.monotonic()):
                    outgoing.put(telemetry_message(sample))
            except Exception:  # a probe's surprise never ends the stream
                logger.exception("telemetry sample failed")
            next_at = max(next_at + interval, time.monotonic())
            if self.stopping.wait(max(0.0, next_at - time.monotonic())):
                return

    def _tick(self) -> None:
        """Commands and members looked at every second (executor.tick), for as long as the
        agent runs; each stream's watcher is woken after each look."""
        while not self.stopping.wait(MEMBER_POLL_SECONDS):
            try:
                self.executor.tick()
            except Exception:  # a look that failed never takes the agent down
                logger.exception("looking at commands failed")
            with self.ticked:
                self.ticked.notify_all()

    def _watch(self, outgoing: queue.Queue, call) -> None:
        """After each tick, for this stream: what changed is reported (an exit, a cleanup
        done, a stop escalated); old logs are removed."""
        expired_at = 0.0
        while not self.stopping.is_set() and call.is_active():
            with self.ticked:
                self.ticked.wait(MEMBER_POLL_SECONDS * 2)
            if self.stopping.is_set() or not call.is_active():
                return
            try:
                self._report_finished(outgoing)
            except Exception:  # a report that failed is made again after the next tick
                logger.exception("reporting commands failed")
            if time.monotonic() - expired_at > 3600:
                expired_at = time.monotonic()
                self.executor.expire_logs(LOG_RETENTION_SECONDS)

    def _seconds_until_rotation(self) -> float:
        cert = x509.load_pem_x509_certificate((self.directory / state.CERTIFICATE).read_bytes())
        issued = self.identity.get("credential_issued_at")
        start = datetime.fromisoformat(issued) if issued else cert.not_valid_before_utc
        due = start + (cert.not_valid_after_utc - start) * ROTATE_AT
        return (due - datetime.now(UTC)).total_seconds()

    def _rotate_when_due(self, stub) -> None:
        """J6: a new key and certificate at two thirds of the lifetime; the stream stays up."""
        call = self.call
        while not self.stopping.wait(max(0.0, self._seconds_until_rotation())):
            if not call.is_active():
                return
            key_pem, csr = enroll.new_key_and_csr(socket.gethostname())
            try:
                reply = stub.RotateCredential(pb.RotateCredentialRequest(csr=csr), timeout=30)
            except grpc.RpcError as error:
                logger.info(
                    "rotation failed (%s); retrying in %ds",
                    error.code().name,
                    ROTATION_RETRY_SECONDS,
                )
                if self.stopping.wait(ROTATION_RETRY_SECONDS):
                    return
                continue
            self.identity = {
                **self.identity,
                "credential_expires_at": reply.credential_expires_at,
                "credential_issued_at": datetime.now(UTC).isoformat(),
            }
            state.save_rotated(
                self.directory,
                identity=self.identity,
                key_pem=key_pem,
                certificate_pem=reply.certificate,
            )
            logger.info("credential rotated; expires %s", reply.credential_expires_at)
