"""The state dir's ``commands/``: one JSON file per command (a member's is its start's), each
written whole before anything it describes happens (L5, R4), beside the exit file its
wrapper writes (``<id>.exit``) and the output of a ``run`` (``<id>.log``). Reading it changes
nothing."""

import dataclasses
import json
import logging
import threading
from pathlib import Path

from .. import state
from ..command import COMMAND_ID, Command
from .record import START, Member

logger = logging.getLogger("tuneplane-node")


def _record(data: dict):
    """A record from its file: a member for a start, else a command. Fields this agent does
    not know (an older or newer agent's) are left out, and ones it misses take defaults."""
    kind = Member if data.get("kind") == START else Command
    names = {f.name for f in dataclasses.fields(kind)}
    return kind(**{key: value for key, value in data.items() if key in names})


class Store:
    def __init__(self, root: Path):
        self.directory = root / "commands"
        # The stream's reader, the member runner's tick and the prober write here.
        self.lock = threading.RLock()

    def path(self, command_id: str, suffix: str = ".json") -> Path:
        return self.directory / f"{command_id}{suffix}"

    def save(self, record) -> None:
        state.ensure_private_dir(self.directory)
        data = json.dumps(dataclasses.asdict(record)).encode()
        state.write_private(self.path(record.command_id), data)

    def load(self, path: Path):
        try:
            return _record(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, AttributeError):
            logger.warning("unreadable command file %s left alone", path)
            return None

    def get(self, command_id: str):
        if not isinstance(command_id, str) or not COMMAND_ID.fullmatch(command_id):
            return None
        path = self.path(command_id)
        return self.load(path) if path.exists() else None

    def all(self) -> list:
        """Every command and member as last written, in id order."""
        if not self.directory.is_dir():
            return []
        with self.lock:
            found = (self.load(path) for path in sorted(self.directory.glob("*.json")))
            return [record for record in found if record is not None]

    def members(self) -> list[Member]:
        return [record for record in self.all() if isinstance(record, Member)]

    def exit_code(self, command_id: str, vanished: int) -> int | None:
        """The code its wrapper wrote, ``vanished`` for an empty file; None while there is none."""
        try:
            text = self.path(command_id, ".exit").read_text().strip()
        except FileNotFoundError:
            return None
        try:
            return int(text) if text else vanished
        except ValueError:
            return vanished

    def forget(self, command_id: str) -> None:
        for suffix in (".json", ".exit", ".env", ".sh"):
            self.path(command_id, suffix).unlink(missing_ok=True)
