"""The node's private state directory: identity, key, certificate, CA bundle.

The directory is 0700 and every file 0600; each file is written to a temporary
name and renamed, so a crash never leaves half a credential behind.
"""

import json
import os
from pathlib import Path

DEFAULT_STATE_DIR = "/var/lib/tuneplane-node"
IDENTITY = "node.json"
KEY = "node.key"
CERTIFICATE = "node.crt"
CA_BUNDLE = "ca.pem"


def state_dir(explicit: str | None = None) -> Path:
    return Path(explicit or os.environ.get("TUNEPLANE_NODE_STATE_DIR") or DEFAULT_STATE_DIR)


def ensure_private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)


def write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync(path.parent)


def _sync(directory: Path) -> None:
    """A rename is durable once its directory is."""
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_identity(directory: Path) -> dict | None:
    try:
        return json.loads((directory / IDENTITY).read_text())
    except FileNotFoundError:
        return None


def save_credential(
    directory: Path, *, identity: dict, key_pem: bytes, certificate_pem: str, ca_bundle: str
) -> None:
    """Key, certificate and CA first; the identity file last marks the join complete."""
    ensure_private_dir(directory)
    write_private(directory / KEY, key_pem)
    write_private(directory / CERTIFICATE, certificate_pem.encode())
    write_private(directory / CA_BUNDLE, ca_bundle.encode())
    write_private(directory / IDENTITY, json.dumps(identity, indent=2).encode())


# A rotation (J6) stages the new pair beside the old one, then puts it in place. The staged
# identity is written last and put in place last: while it exists, the staged pair is whole.
STAGED = ".next"
ROTATED = (KEY, CERTIFICATE, IDENTITY)  # the order they are put in place


def save_rotated(directory: Path, *, identity: dict, key_pem: bytes, certificate_pem: str) -> None:
    """A rotated credential: a crash at any point leaves the old pair or the new one, never
    a key with the other's certificate (read_identity finishes or undoes what it finds)."""
    write_private(directory / (KEY + STAGED), key_pem)
    write_private(directory / (CERTIFICATE + STAGED), certificate_pem.encode())
    write_private(directory / (IDENTITY + STAGED), json.dumps(identity, indent=2).encode())
    _put_staged_in_place(directory)


def _put_staged_in_place(directory: Path) -> None:
    for name in ROTATED:  # each rename durable before the next: the identity's comes last
        staged = directory / (name + STAGED)
        if staged.exists():
            os.replace(staged, directory / name)
            _sync(directory)


def settle_rotation(directory: Path) -> None:
    """What the agent does first when it starts serving (the one writer of its credential):
    a whole staged pair is put in place; a partial one (the crash came while staging) is
    dropped, and the old pair, untouched, stays."""
    if not directory.is_dir():
        return
    if (directory / (IDENTITY + STAGED)).exists():
        _put_staged_in_place(directory)
        return
    for name in ROTATED:
        (directory / (name + STAGED)).unlink(missing_ok=True)
