"""Commands the console gave this node, and their durable state in the state dir (L5).

Each command is a file ``commands/<id>.json``, written before the console is
told "running". A ``run`` command's process starts in a session of its own, so
it outlives the agent: an agent that is killed, upgraded or loses its stream
does not take the work with it. The process's exit code is written by a small
shell wrapper to ``<id>.exit``, so an agent that restarts still learns how a
process it no longer parents ended.
"""

import json
import logging
import re
import subprocess
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from . import state

logger = logging.getLogger("tuneplane-node")

RUNNING, SUCCEEDED, FAILED = "running", "succeeded", "failed"
# The code a command gets when its process is gone and left no exit code behind.
VANISHED = -1
# "$0" is the exit file; the command's argv follows. The code is written atomically.
WRAPPER = '"$@"; code=$?; echo "$code" > "$0.tmp" && mv "$0.tmp" "$0"'
# A command id names files in the state dir: nothing that could climb out of it.
COMMAND_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}")


@dataclass
class Command:
    command_id: str
    kind: str
    argv: list
    state: str = RUNNING
    exit_code: int | None = None
    pid: int | None = None
    started: str | None = None  # the process's start time in /proc, against pid reuse


def _started(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class Commands:
    def __init__(self, directory: Path):
        self.directory = directory / "commands"
        self.children: dict[str, subprocess.Popen] = {}
        # The stream's reader accepts commands while the heartbeat thread refreshes them.
        self.lock = threading.RLock()

    def _path(self, command_id: str, suffix: str = ".json") -> Path:
        return self.directory / f"{command_id}{suffix}"

    def _save(self, command: Command) -> None:
        state.ensure_private_dir(self.directory)
        state.write_private(self._path(command.command_id), json.dumps(asdict(command)).encode())

    def _load(self, path: Path) -> Command | None:
        try:
            return Command(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            logger.warning("unreadable command file %s left alone", path)
            return None

    def known(self) -> list[Command]:
        """Every command in the state dir, with the state of its process now."""
        if not self.directory.is_dir():
            return []
        with self.lock:
            found = (self._load(path) for path in sorted(self.directory.glob("*.json")))
            return [self._refresh(command) for command in found if command is not None]

    def _refresh(self, command: Command) -> Command:
        if command.state != RUNNING:
            return command
        child = self.children.get(command.command_id)
        if child is not None:
            child.poll()  # reap it, so its pid is not a zombie
        exit_file = self._path(command.command_id, ".exit")
        if exit_file.exists():
            code = int(exit_file.read_text().strip() or VANISHED)
        elif command.pid and _started(command.pid) == command.started:
            return command
        else:
            code = VANISHED
        command.state, command.exit_code = (SUCCEEDED if code == 0 else FAILED), code
        self._save(command)
        self.children.pop(command.command_id, None)
        return command

    def accept(self, command_id: str, kind: str, payload) -> Command | None:
        """Persist, then start. A command already known is not started twice."""
        if not COMMAND_ID.fullmatch(command_id):
            logger.warning("command with an unusable id %r ignored", command_id[:80])
            return None
        with self.lock:
            return self._accept(command_id, kind, payload)

    def _accept(self, command_id: str, kind: str, payload) -> Command:
        path = self._path(command_id)
        if path.exists():
            existing = self._load(path)
            if existing is not None:
                return self._refresh(existing)
        argv = payload.get("argv") if isinstance(payload, dict) else None
        command = Command(command_id=command_id, kind=kind, argv=argv or [])
        self._save(command)
        if kind != "run" or not argv or not all(isinstance(arg, str) for arg in argv):
            command.state, command.exit_code = FAILED, VANISHED
            self._save(command)
            return command
        log = open(self._path(command_id, ".log"), "ab")  # noqa: SIM115 -- the child's, closed below
        try:
            child = subprocess.Popen(
                ["/bin/sh", "-c", WRAPPER, str(self._path(command_id, ".exit")), *argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        except OSError as error:
            logger.warning("command %s could not start: %s", command_id, error)
            command.state, command.exit_code = FAILED, VANISHED
        else:
            self.children[command_id] = child
            command.pid, command.started = child.pid, _started(child.pid)
        finally:
            log.close()
        self._save(command)
        return command

    def forget_finished(self, command_ids) -> None:
        """Finished commands the console has reconciled need not be reported again."""
        with self.lock:
            for command_id in command_ids:
                path = self._path(command_id)
                command = self._load(path) if path.exists() else None
                if command is not None and command.state != RUNNING:
                    # The output log stays for the machine's administrator.
                    for suffix in (".json", ".exit"):
                        self._path(command_id, suffix).unlink(missing_ok=True)
