"""Commands the console gave this node, and their durable state in the state dir (L5).

Kinds: ``run`` (a process), and a member's: ``start`` (a member, member/), ``stop`` (SIGTERM
to it, SIGKILL after its grace) and ``cleanup`` (whatever it left behind removed; its cards
may then go to the next job, R7).

Each command is a file ``commands/<id>.json`` (member/store.py), written before the console
is told "running". A ``run`` command's process starts in a session of its own, so it
outlives the agent: an agent that is killed, upgraded or loses its stream does not take the
work with it. The process's exit code is written by a small shell wrapper to ``<id>.exit``,
so an agent that restarts still learns how a process it no longer parents ended.

Reading (``known``, ``get``) changes nothing; ``tick`` is where what runs is looked at and
moved on — the agent calls it every second, whether or not the console is connected.
"""

import logging
import subprocess
import time
from pathlib import Path

from .command import (
    CLEANUP,
    COMMAND_ID,
    FAILED,
    RUNNING,
    START,
    STOP,
    SUCCEEDED,
    VANISHED,
    WRAPPER,
    Command,
    process_start_time,
)
from .member import launch
from .member.record import Member
from .member.runner import Runner
from .member.store import Store
from .wire import DEFAULT_GRACE

logger = logging.getLogger("tuneplane-node")


class Executor:
    """Accepts the console's commands, runs them, and looks at what runs on each tick."""

    def __init__(
        self,
        directory: Path,
        devices=lambda: [],
        storage_root: str | None = None,
        scope: str = "local",
        runtime=lambda: "",
        uids: tuple[int, int] | None = None,
        deny_cidrs: list[str] | None = None,
    ):
        self.root = directory
        self.store = Store(directory)
        self.directory = self.store.directory
        self.lock = self.store.lock
        self.runner = Runner(
            self.store,
            directory,
            devices=devices,
            storage_root=storage_root,
            scope=scope,
            runtime=runtime,
            uids=uids,
            deny_cidrs=deny_cidrs or [],
        )
        self.children: dict[str, subprocess.Popen] = {}  # run commands' processes
        self.scope, self.cgroup = scope, self.runner.cgroup
        self.logs, self.scratch = self.runner.logs, self.runner.scratch

    def get(self, command_id: str):
        return self.store.get(command_id)

    def known(self) -> list:
        """Every command and member in the state dir, as last written."""
        return self.store.all()

    def tick(self, now: float | None = None) -> None:
        """What runs, looked at: run commands that ended are recorded, and every member is
        advanced (member/runner.py)."""
        now = time.time() if now is None else now
        with self.lock:
            for record in self.store.all():
                if isinstance(record, Command) and record.kind == "run":
                    self._refresh_run(record)
            self.runner.tick(now)

    def accept(self, command_id: str, kind: str, payload):
        """Persist, then start. A command already known is not started twice."""
        if not COMMAND_ID.fullmatch(command_id):
            logger.warning("command with an unusable id %r ignored", command_id[:80])
            return None
        with self.lock:
            existing = self.store.get(command_id)
            if existing is not None:
                return existing
            if kind == START:
                return self.runner.start(command_id, payload)
            payload = payload if isinstance(payload, dict) else {}
            if kind in (STOP, CLEANUP):
                return self._on_member(command_id, kind, payload)
            return self._run(command_id, kind, payload)

    def _run(self, command_id: str, kind: str, payload: dict) -> Command:
        argv = payload.get("argv")
        command = Command(command_id=command_id, kind=kind, argv=argv or [])
        self.store.save(command)
        if kind != "run" or not argv or not all(isinstance(arg, str) for arg in argv):
            command.state, command.exit_code = FAILED, VANISHED
            self.store.save(command)
            return command
        exit_file = str(self.store.path(command_id, ".exit"))
        try:
            child = launch.spawn(
                ["/bin/sh", "-c", WRAPPER, exit_file, *argv], self.store.path(command_id, ".log")
            )
        except OSError as error:
            logger.warning("run %s could not start: %s", command_id, error)
            command.state, command.exit_code = FAILED, VANISHED
        else:
            self.children[command_id] = child
            command.pid, command.started = child.pid, process_start_time(child.pid)
        self.store.save(command)
        return command

    def _refresh_run(self, command: Command) -> None:
        if command.state != RUNNING:
            return
        child = self.children.get(command.command_id)
        if child is not None:
            child.poll()  # reap it, so its pid is not a zombie
        code = self.store.exit_code(command.command_id, VANISHED)
        if code is None:
            if command.pid and process_start_time(command.pid) == command.started:
                return
            code = VANISHED
        command.state, command.exit_code = (SUCCEEDED if code == 0 else FAILED), code
        self.store.save(command)
        self.children.pop(command.command_id, None)

    def _on_member(self, command_id: str, kind: str, payload: dict) -> Command:
        """A stop or cleanup: applied to the member it names, answered at once. A member
        this node does not know is still cleaned by its id (a lost state file, R7)."""
        command = Command(command_id=command_id, kind=kind)
        member_id = payload.get("member")
        grace = payload.get("grace_seconds")
        grace = float(grace) if isinstance(grace, (int, float)) else DEFAULT_GRACE
        member = self.store.get(member_id) if isinstance(member_id, str) else None
        if not isinstance(member, Member):
            if kind == CLEANUP and isinstance(member_id, str):
                self.runner.clean_unknown(member_id)
            command.reason = "unknown_member"
        elif kind == CLEANUP:
            self.runner.cleanup(member, grace)
        else:
            self.runner.stop(member, grace)
        command.state, command.exit_code = SUCCEEDED, 0
        self.store.save(command)
        return command

    def log_read(self, member_id: str, limit: int, offset: int | None = None):
        return self.runner.log_read(member_id, limit, offset)

    def forget_finished(self, told) -> None:
        """Finished commands the console has reconciled — (id, what it was told) — need not be
        reported again: one that changed since it was told is kept until that is told too;
        a member's only once it is cleaned (its cards are held till then, R7)."""
        with self.lock:
            for command_id, reported in told:
                record = self.store.get(command_id)
                if (
                    record is not None
                    and record.state != RUNNING
                    and not record.holds_cards
                    and record.reported() == reported
                ):
                    self.store.forget(command_id)  # the output log stays for the administrator

    def expire_logs(self, retention_seconds: float) -> None:
        keep = {record.command_id for record in self.store.all()}
        self.runner.expire_logs(retention_seconds, keep)
