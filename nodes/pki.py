"""The console's certificate authority: it signs node CSRs and the gateway's certificate.

Lives in ``TUNEPLANE_PKI_DIR`` (0700): ``ca.key`` and ``ca.pem`` (0600). The console
keeps a node certificate's serial, fingerprint and expiry; it never sees a
node's private key — the node makes it and sends only a CSR (J3).
"""

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from django.conf import settings

from tuneplane.errors import ValidationFailed

CA_LIFETIME = dt.timedelta(days=3650)
SERVER_LIFETIME = dt.timedelta(days=365)
# Certificates are valid from a little before issue, so a node whose clock is a
# minute behind the console's can still connect.
CLOCK_SKEW = dt.timedelta(minutes=5)
NODE_URI_PREFIX = "spiffe://tuneplane/node/"
MAX_CSR_BYTES = 16 * 1024


class PkiMissing(Exception):
    pass


def pki_dir() -> Path:
    return Path(settings.TUNEPLANE_PKI_DIR)


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def ca_init(directory: Path | None = None) -> bool:
    """Create the CA if there is none. Returns whether it made one."""
    directory = directory or pki_dir()
    if (directory / "ca.pem").exists():
        return False
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Tuneplane console CA")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(
        directory / "ca.key",
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        0o600,
    )
    # Its certificate too is the console's user's alone (R23): the console hands it out itself.
    _write(directory / "ca.pem", cert.public_bytes(serialization.Encoding.PEM), 0o600)
    _load.cache_clear()
    return True


@dataclass(frozen=True)
class CertificateAuthority:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    pem: str


@lru_cache(maxsize=4)
def _load(directory: str) -> CertificateAuthority:
    path = Path(directory)
    try:
        pem = (path / "ca.pem").read_bytes()
        key = serialization.load_pem_private_key((path / "ca.key").read_bytes(), password=None)
    except FileNotFoundError:
        raise PkiMissing(f"no CA in {path}: run `python manage.py pki init`") from None
    return CertificateAuthority(key=key, cert=x509.load_pem_x509_certificate(pem), pem=pem.decode())


def load_ca() -> CertificateAuthority:
    return _load(str(pki_dir()))


def parse_csr(pem: str) -> x509.CertificateSigningRequest:
    """A CSR the console will sign: PEM, self-signed correctly, P-256 or Ed25519 (J3)."""
    if not isinstance(pem, str) or not pem.strip() or len(pem) > MAX_CSR_BYTES:
        raise ValidationFailed("csr must be a PEM certificate signing request.", field="csr")
    try:
        csr = x509.load_pem_x509_csr(pem.encode())
    except ValueError:
        raise ValidationFailed(
            "csr is not a PEM certificate signing request.", field="csr"
        ) from None
    key = csr.public_key()
    if not (
        isinstance(key, ed25519.Ed25519PublicKey)
        or (isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1")
    ):
        raise ValidationFailed("csr key must be EC P-256 or Ed25519.", field="csr")
    if not csr.is_signature_valid:
        raise ValidationFailed("csr signature does not verify.", field="csr")
    return csr


def node_uri(node_id: str) -> str:
    return NODE_URI_PREFIX + node_id


@dataclass(frozen=True)
class IssuedCertificate:
    pem: str
    serial: str
    fingerprint_sha256: str
    not_before: dt.datetime
    not_after: dt.datetime


def _issued(cert: x509.Certificate) -> IssuedCertificate:
    return IssuedCertificate(
        pem=cert.public_bytes(serialization.Encoding.PEM).decode(),
        serial=format(cert.serial_number, "x"),
        fingerprint_sha256=cert.fingerprint(hashes.SHA256()).hex(),
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
    )


def sign_node_csr(
    csr: x509.CertificateSigningRequest, node_id: str, lifetime: dt.timedelta
) -> IssuedCertificate:
    """The node's client certificate: its console-issued id in the SAN, and nothing it chose."""
    ca = load_ca()
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
        .issuer_name(ca.cert.subject)
        .public_key(csr.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + lifetime)
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(node_uri(node_id))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
        .sign(ca.key, hashes.SHA256())
    )
    return _issued(cert)


def issue_server_certificate(hosts: list[str], directory: Path | None = None) -> Path:
    """The gateway's TLS certificate and key, for each host name or IP in ``hosts``."""
    directory = directory or pki_dir()
    ca = load_ca()
    key = ec.generate_private_key(ec.SECP256R1())
    names = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + SERVER_LIFETIME)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    _write(
        directory / "gateway.key",
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        0o600,
    )
    _write(directory / "gateway.pem", cert.public_bytes(serialization.Encoding.PEM), 0o600)
    return directory / "gateway.pem"
