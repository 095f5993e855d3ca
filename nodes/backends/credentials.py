"""A cluster Fleet's credential, read at each call from where its config names — only from
the places tuneplane.secret_sources allows, checked again at every read."""

import os
import stat
from pathlib import Path

from tuneplane.secret_sources import env_name_refusal, file_path_refusal, resolved_path_refusal

from .base import BackendError

MAX_TOKEN_BYTES = 64 * 1024  # a JWT or a service-account token is a few KiB


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
            raise BackendError(
                f"environment variable {env_name} (config.{env_key}) is empty or not set"
            )
        return token
    if file_path:
        refusal = file_path_refusal(file_path) or resolved_path_refusal(Path(file_path))
        if refusal:
            raise BackendError(f"config.{file_key} {file_path} {refusal}")
        try:
            token = _read_small_regular_file(Path(file_path).resolve())
        except (OSError, UnicodeDecodeError, ValueError) as error:
            reason = getattr(error, "strerror", None) or str(error) or "not text"
            raise BackendError(f"config.{file_key} {file_path} cannot be read: {reason}") from None
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
