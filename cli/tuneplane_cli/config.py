"""Where the console is and the token to call it with: ``tuneplane login`` writes both to
``$XDG_CONFIG_HOME/tuneplane/config.toml`` (``~/.config`` without it), readable by its owner
only; ``TUNEPLANE_SERVER`` and ``TUNEPLANE_TOKEN`` override what it says."""

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

import tomli_w


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class Config:
    server: str
    token: str


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "tuneplane" / "config.toml"


def _stored(path: Path) -> dict:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(
            f"{path} is not valid TOML ({error}); run `tuneplane login` again."
        ) from error


def load() -> Config:
    """The server and token to use: the environment's, else the file's."""
    path = config_path()
    stored = _stored(path)
    server = os.environ.get("TUNEPLANE_SERVER") or stored.get("server", "")
    token = os.environ.get("TUNEPLANE_TOKEN") or stored.get("token", "")
    if not server:
        raise ConfigError(
            "No console to talk to: run `tuneplane login --server URL --token TOKEN`, "
            f"or set TUNEPLANE_SERVER (looked in {path})."
        )
    return Config(server=server.rstrip("/"), token=token)


def save(server: str, token: str) -> Path:
    """Written 0600 in a 0700 directory, also when the file was there before."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        os.fchmod(handle.fileno(), 0o600)
        tomli_w.dump({"server": server.rstrip("/"), "token": token}, handle)
    return path
