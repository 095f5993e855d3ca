"""Where a cluster Fleet's credential is read from, and the only places it may be.

A Fleet's config names an environment variable or a file; the console reads it at each call
and sends it to the URL the same config names. An administrator can edit that config, so
the names are confined: a variable must be named ``TUNEPLANE_TOKEN_*`` and a file must
lie in ``TUNEPLANE_SECRETS_DIR`` (after symlinks, and never in the console's PKI directory).
Otherwise config could point the console at ``DATABASE_URL`` or the CA key and have it sent
to a URL of the administrator's choosing. The checks run when the config is saved and again
at every read, so a Fleet saved before a rule tightened cannot read past it.
"""

import os
import stat
from pathlib import Path, PurePosixPath

from django.conf import settings

from .base import BackendError

TOKEN_ENV_PREFIX = "TUNEPLANE_TOKEN_"
MAX_TOKEN_BYTES = 64 * 1024  # a JWT or a service-account token is a few KiB
_IN_PKI = ("is in the console's PKI directory (TUNEPLANE_PKI_DIR), which holds no cluster "
           "credential")


def env_name_refusal(name: str) -> str:
    """Why ``name`` may not hold a cluster credential, or "" when it may."""
    if not name.startswith(TOKEN_ENV_PREFIX) or name == TOKEN_ENV_PREFIX:
        return (f"must be an environment variable named {TOKEN_ENV_PREFIX}<something>: "
                "only those may hold a cluster credential")
    return ""


def file_path_refusal(path: str) -> str:
    """Why ``path`` may not hold a cluster credential, or "" when it may (lexically)."""
    secrets_dir = Path(settings.TUNEPLANE_SECRETS_DIR)
    pure = PurePosixPath(path)
    if "\x00" in path:
        return "must not contain a NUL character"
    if not pure.is_absolute():
        return "must be an absolute path"
    if ".." in pure.parts or not _within(Path(pure), secrets_dir):
        return (f"must be a file in TUNEPLANE_SECRETS_DIR ({secrets_dir}): only files there "
                "may hold a cluster credential")
    if _within(Path(pure), Path(settings.TUNEPLANE_PKI_DIR)):
        return _IN_PKI
    return ""


def read_token(*, env_key: str, env_name: str, file_key: str, file_path: str) -> str:
    """The credential the config names, read now (so a rotated one is used at the next
    call); "" when it names none. Raises BackendError naming the config key, never the
    credential."""
    if env_name:
        refusal = env_name_refusal(env_name)
        if refusal:
            raise BackendError(f"config.{env_key} {env_name} {refusal}")
        token = os.environ.get(env_name, "").strip()
        if not token:
            raise BackendError(f"environment variable {env_name} (config.{env_key}) is empty "
                               "or not set")
        return token
    if file_path:
        refusal = file_path_refusal(file_path) or _resolved_refusal(Path(file_path))
        if refusal:
            raise BackendError(f"config.{file_key} {file_path} {refusal}")
        try:
            token = _read_small_regular_file(Path(file_path).resolve())
        except (OSError, UnicodeDecodeError, ValueError) as error:
            reason = getattr(error, "strerror", None) or str(error) or "not text"
            raise BackendError(f"config.{file_key} {file_path} cannot be read: {reason}") \
                from None
        if not token:
            raise BackendError(f"config.{file_key} {file_path} is empty")
        return token
    return ""


def _read_small_regular_file(path: Path) -> str:
    """A credential file's text: a regular file (a FIFO would block the caller) of at most
    MAX_TOKEN_BYTES."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise ValueError("not a regular file")
        data = file.read(MAX_TOKEN_BYTES + 1)
    if len(data) > MAX_TOKEN_BYTES:
        raise ValueError(f"larger than {MAX_TOKEN_BYTES} bytes")
    return data.decode().strip()


def _resolved_refusal(path: Path) -> str:
    """The lexical check again after symlinks: a link in the secrets directory may not lead
    out of it, nor to the console's own keys."""
    real = path.resolve()
    if not _within(real, Path(settings.TUNEPLANE_SECRETS_DIR).resolve()):
        return "leads out of TUNEPLANE_SECRETS_DIR through a symbolic link"
    if _within(real, Path(settings.TUNEPLANE_PKI_DIR).resolve()):
        return _IN_PKI
    return ""


def _within(path: Path, directory: Path) -> bool:
    return path != directory and path.is_relative_to(directory)
