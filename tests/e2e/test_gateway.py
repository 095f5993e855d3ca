"""The control gateway for real: a grpcserve subprocess, mTLS, the real agent (L1 lease, L5)."""

import datetime as dt
import signal
import threading

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from audit.models import AuditEvent
from nodes.agent.proto import control_pb2 as pb
from nodes.agent.proto import control_pb2_grpc
from nodes.choices import SchedulingState
from nodes.models import ControlSession, Node, NodeCredential
from nodes.services.join import node_join
from tests.conftest import H100_INVENTORY, make_csr

from .agents import connect, credentials, serve, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_agent_connects_heartbeats_and_a_killed_agent_leaves_its_work_alone(
    gateway, joined, admin_api, tmp_path
):
    node, env, _ = joined
    assert node.scheduling_state == SchedulingState.ENROLLED
    agent = serve(env, gateway, tmp_path)
    try:
        shown = wait_until(
            lambda: (
                lambda body: body
                if body["connection"]["state"] == "connected"
                and body["scheduling"]["state"] == "schedulable"
                else None
            )(admin_api.get(f"/api/nodes/{node.id}").json()),
            what="connected and schedulable",
        )
        first_beat = shown["connection"]["last_heartbeat_at"]
        first_observed = shown["inventory"]["observed_at"]
        wait_until(
            lambda: admin_api.get(f"/api/nodes/{node.id}").json()["connection"]["last_heartbeat_at"]
            != first_beat,
            what="a renewed lease",
        )
        # L1: beats naming the same inventory keep its observation fresh, without a report.
        wait_until(
            lambda: admin_api.get(f"/api/nodes/{node.id}").json()["inventory"]["observed_at"]
            != first_observed,
            what="a renewed inventory observation",
        )
        assert (
            AuditEvent.objects.filter(target_id=node.id, action="node.inventory_reported").count()
            == 1
        )
    finally:
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
    session = wait_until(
        lambda: ControlSession.objects.filter(node=node, closed_at__isnull=False).first(),
        timeout=30,
        what="the session to close",
    )
    assert session.close_reason
    assert admin_api.get(f"/api/nodes/{node.id}").json()["connection"]["state"] == "disconnected"
    # L5: a lost connection is not a dead container; nothing about the node's work changed.
    assert Node.objects.get(pk=node.id).scheduling_state == SchedulingState.SCHEDULABLE
    actions = set(
        AuditEvent.objects.filter(target_id=str(session.id)).values_list("action", flat=True)
    )
    assert actions == {"control_session.opened", "control_session.closed"}


def test_agent_stops_cleanly_on_sigterm(gateway, joined, tmp_path):
    node, env, _ = joined
    agent = serve(env, gateway, tmp_path)
    agent.wait_for("connected to")
    agent.send_signal(signal.SIGTERM)
    output = agent.communicate(timeout=20)[0]
    assert agent.returncode == 0, output
    assert "connected to" in output and "stopped" in output


def test_health_is_served_over_mtls(gateway, joined):
    _, _, directory = joined
    with grpc.secure_channel(gateway, credentials(directory)) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="tuneplane.node.v1.NodeControl"), timeout=5
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def foreign_certificate(node_id: str) -> tuple[bytes, bytes]:
    """A well-formed node certificate from a CA the console has never seen."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Somebody else's CA")])
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier(f"spiffe://tuneplane/node/{node_id}")]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return (
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        cert.public_bytes(serialization.Encoding.PEM),
    )


def test_identity_is_the_certificate_and_every_other_claim_is_refused(
    gateway, joined, node_fleet, mint
):
    node, _, directory = joined
    other = node_join(
        token=mint(node_fleet)[1], fleet_id="gpu-lab", csr=make_csr()[1], inventory=H100_INVENTORY
    ).node
    sessions_before = ControlSession.objects.count()

    no_cert = connect(gateway, credentials(directory, with_client=False), node.id)
    assert isinstance(no_cert, grpc.RpcError) and no_cert.code() == grpc.StatusCode.UNAVAILABLE
    key, cert = foreign_certificate(node.id)
    foreign = connect(gateway, credentials(directory, key=key, cert=cert), node.id)
    assert isinstance(foreign, grpc.RpcError) and foreign.code() == grpc.StatusCode.UNAVAILABLE
    impostor = connect(gateway, credentials(directory), other.id)
    assert impostor.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "other than the certificate" in impostor.details()

    NodeCredential.objects.filter(node=node).update(revoked_at=dt.datetime.now(dt.UTC))
    revoked = connect(gateway, credentials(directory), node.id)
    assert revoked.code() == grpc.StatusCode.PERMISSION_DENIED and "revoked" in revoked.details()
    NodeCredential.objects.filter(node=node).update(revoked_at=None)
    Node.objects.filter(pk=node.id).update(scheduling_state=SchedulingState.REMOVED)
    removed = connect(gateway, credentials(directory), node.id)
    assert removed.code() == grpc.StatusCode.PERMISSION_DENIED and "removed" in removed.details()
    assert ControlSession.objects.count() == sessions_before


def held_open(first_message, release: threading.Event):
    """A request stream that sends one message and stays open until released."""
    yield first_message
    release.wait(15)


def test_a_second_stream_replaces_the_first(gateway, joined):
    node, _, directory = joined
    hello = pb.NodeMessage(hello=pb.Hello(node_id=node.id))
    release = threading.Event()
    with (
        grpc.secure_channel(gateway, credentials(directory)) as one,
        grpc.secure_channel(gateway, credentials(directory)) as two,
    ):
        first = control_pb2_grpc.NodeControlStub(one).Connect(held_open(hello, release), timeout=10)
        assert next(first).WhichOneof("body") == "welcome"
        second = control_pb2_grpc.NodeControlStub(two).Connect(
            held_open(hello, release), timeout=10
        )
        assert next(second).WhichOneof("body") == "welcome"
        closing = next(first)
        release.set()
    assert closing.WhichOneof("body") == "close"
    assert closing.close.reason == "replaced by a newer stream"
    assert (
        ControlSession.objects.filter(
            node=node, close_reason="replaced by a newer stream", closed_at__isnull=False
        ).count()
        == 1
    )


def test_J6_the_credential_rotates_by_itself_and_the_stream_stays(
    gateway_short_credentials, joined_short, tmp_path
):
    node, env, directory = joined_short
    first_cert = (directory / "node.crt").read_bytes()
    agent = serve(env, gateway_short_credentials, tmp_path)
    try:
        wait_until(
            lambda: NodeCredential.objects.filter(node=node).count() >= 2,
            timeout=30,
            what="a rotated credential",
        )
        wait_until(
            lambda: (directory / "node.crt").read_bytes() != first_cert,
            what="the new certificate on disk",
        )
        open_sessions = ControlSession.objects.filter(node=node, closed_at__isnull=True)
        assert open_sessions.count() == 1
        assert not ControlSession.objects.filter(node=node, closed_at__isnull=False).exists()
        event = AuditEvent.objects.filter(action="node.credential_rotated").first()
        assert event.before["credential_serial"] != event.after["credential_serial"]
        new_serial = x509.load_pem_x509_certificate((directory / "node.crt").read_bytes())
        assert NodeCredential.objects.filter(
            node=node, serial=format(new_serial.serial_number, "x")
        ).exists()
    finally:
        agent.send_signal(signal.SIGTERM)
        output = agent.communicate(timeout=20)[0]
    assert "credential rotated" in output
    # The rotated credential opens a new stream too.
    assert (
        connect(gateway_short_credentials, credentials(directory), node.id).WhichOneof("body")
        == "welcome"
    )


def console_signed(node_id: str, not_before, not_after) -> tuple[bytes, bytes, str]:
    """A node certificate from the console's own CA, with the validity window given."""
    from nodes import pki

    ca = pki.load_ca()
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(pki.node_uri(node_id))]),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    return (
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        cert.public_bytes(serialization.Encoding.PEM),
        format(cert.serial_number, "x"),
    )


@pytest.mark.parametrize("window", ["expired", "not yet valid"])
def test_a_certificate_outside_its_validity_is_refused(gateway, joined, window):
    node, _, directory = joined
    now = dt.datetime.now(dt.UTC)
    start, end = (
        (now - dt.timedelta(hours=2), now - dt.timedelta(hours=1))
        if window == "expired"
        else (now + dt.timedelta(hours=1), now + dt.timedelta(hours=2))
    )
    key, cert, serial = console_signed(node.id, start, end)
    NodeCredential.objects.create(
        node=node,
        serial=serial,
        fingerprint_sha256=serial.zfill(64),
        not_before=start,
        not_after=end,
    )
    refused = connect(gateway, credentials(directory, key=key, cert=cert), node.id)
    assert isinstance(refused, grpc.RpcError), refused
    assert refused.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.PERMISSION_DENIED)
    assert not ControlSession.objects.filter(node=node).exists()


def test_L1_a_silent_stream_is_closed_when_its_lease_runs_out(gateway, joined):
    node, _, directory = joined
    release = threading.Event()
    with grpc.secure_channel(gateway, credentials(directory)) as channel:
        call = control_pb2_grpc.NodeControlStub(channel).Connect(
            held_open(pb.NodeMessage(hello=pb.Hello(node_id=node.id)), release), timeout=15
        )
        assert next(call).WhichOneof("body") == "welcome"
        closing = next(call)  # no heartbeat is ever sent; the lease TTL is 3 s
        release.set()
    assert closing.close.reason == "lease expired"
    wait_until(
        lambda: ControlSession.objects.filter(
            node=node, close_reason="lease expired", closed_at__isnull=False
        ).exists(),
        what="the session closed",
    )
