"""J6 on the node's disk: a rotation that a SIGKILL interrupts anywhere leaves the agent the
old credential or the new one — a key with its own certificate — never neither."""

import contextlib
import datetime as dt

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from nodes.agent import state


class Killed(BaseException):
    """SIGKILL, as far as the writer can tell: it stops between two steps."""


def credential(days: int) -> tuple[bytes, str, dict]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"n-{days}")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=days))
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    identity = {"node_id": "n-1", "credential_expires_at": cert.not_valid_after_utc.isoformat()}
    return key_pem, cert.public_bytes(serialization.Encoding.PEM).decode(), identity


def held(directory) -> tuple[str, dict]:
    """What the agent holds once it starts again: the certificate on disk, after checking
    the key on disk is its key."""
    state.settle_rotation(directory)
    identity = state.read_identity(directory)
    key = serialization.load_pem_private_key((directory / state.KEY).read_bytes(), None)
    cert_pem = (directory / state.CERTIFICATE).read_text()
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    assert cert.public_key().public_numbers() == key.public_key().public_numbers(), (
        "the key on disk is not the certificate's"
    )
    assert identity["credential_expires_at"] == cert.not_valid_after_utc.isoformat()
    return cert_pem, identity


def steps_of_a_rotation(tmp_path, old, new) -> int:
    directory = tmp_path / "count"
    state.save_credential(
        directory, identity=old[2], key_pem=old[0], certificate_pem=old[1], ca_bundle="ca"
    )
    calls = []
    real = state.os.replace
    state.os.replace = lambda *args: (calls.append(args), real(*args))
    try:
        state.save_rotated(directory, identity=new[2], key_pem=new[0], certificate_pem=new[1])
    finally:
        state.os.replace = real
    return len(calls)


def test_J6_a_kill_at_any_step_of_a_rotation_leaves_the_old_or_the_new_credential(
    tmp_path, monkeypatch
):
    old, new = credential(1), credential(2)
    outcomes = []
    for killed_at in range(steps_of_a_rotation(tmp_path, old, new) + 1):
        directory = tmp_path / f"kill-{killed_at}"
        state.save_credential(
            directory, identity=old[2], key_pem=old[0], certificate_pem=old[1], ca_bundle="ca"
        )
        done = []
        real = state.os.replace

        def replace(*args, real=real, done=done, killed_at=killed_at):
            if len(done) == killed_at:
                raise Killed
            done.append(args)
            return real(*args)

        monkeypatch.setattr(state.os, "replace", replace)
        # The last round is not killed: it comes after every step.
        with contextlib.suppress(Killed):
            state.save_rotated(directory, identity=new[2], key_pem=new[0], certificate_pem=new[1])
        monkeypatch.setattr(state.os, "replace", real)
        cert_pem, identity = held(directory)  # the agent, starting again
        assert cert_pem in (old[1], new[1])
        outcomes.append("new" if cert_pem == new[1] else "old")
        assert not list(directory.glob(f"*{state.STAGED}")), "a staged file left behind"
    assert outcomes[0] == "old" and outcomes[-1] == "new" and set(outcomes) == {"old", "new"}
