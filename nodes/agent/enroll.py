"""Join: make a key here, send only a CSR, keep what comes back (J3)."""

import ipaddress
import json
import socket
import ssl
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from . import __version__

TIMEOUT = 30


class JoinFailed(Exception):
    """One line for the operator: what went wrong and, where it helps, what to do."""


def new_key_and_csr(hostname: str) -> tuple[bytes, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname[:64] or "tuneplane-node")])
        )
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, csr.public_bytes(serialization.Encoding.PEM).decode()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_server(server: str) -> str:
    """The token is the whole authorization: it travels over HTTPS, or stays on this machine."""
    parts = urlsplit(server)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise JoinFailed(f"--server must be an https:// URL, not {server!r}")
    if parts.scheme == "http" and not _is_loopback(parts.hostname):
        raise JoinFailed(
            f"refusing to send a join token over plain http to {parts.hostname}; use https://"
        )
    return server.rstrip("/")


def local_address(server: str) -> str:
    """The address this machine uses to reach the console (no packet is sent)."""
    parts = urlsplit(server)
    host = parts.hostname or "127.0.0.1"
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, parts.port or 443))
            return probe.getsockname()[0]
    except OSError:
        return ""


def join(
    *,
    server: str,
    fleet: str,
    token: str,
    csr: str,
    inventory: dict,
    address: str,
    hostname: str,
    fingerprint: str,
    ca_file: str | None = None,
) -> dict:
    body = json.dumps(
        {
            "fleet": fleet,
            "token": token,
            "csr": csr,
            "inventory": inventory,
            "address": address,
            "hostname": hostname,
            "fingerprint": fingerprint,
            "agent_version": __version__,
        }
    ).encode()
    request = urllib.request.Request(
        f"{server}/api/nodes/join",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": f"tuneplane-node/{__version__}"},
    )
    context = ssl.create_default_context(cafile=ca_file) if server.startswith("https") else None
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT, context=context) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:
        raise JoinFailed(
            f"the console refused the join ({error.code}): {_error_message(error)}"
        ) from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise JoinFailed(f"cannot reach the console at {server}: {reason}") from None


def _error_message(error: urllib.error.HTTPError) -> str:
    try:
        return json.load(error)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return error.reason or "no reason given"
