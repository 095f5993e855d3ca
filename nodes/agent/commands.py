"""Commands the console gave this node, and their durable state in the state dir (L5).

Kinds: ``run`` (a process), and a job's members: ``start`` (a member, members.py),
``stop`` (SIGTERM to it, SIGKILL after its grace) and ``cleanup`` (whatever it left
behind removed; its cards may then go to the next job, R7).

Each command is a file ``commands/<id>.json``, written before the console is
told "running". A ``run`` command's process starts in a session of its own, so
it outlives the agent: an agent that is killed, upgraded or loses its stream
does not take the work with it. The process's exit code is written by a small
shell wrapper to ``<id>.exit``, so an agent that restarts still learns how a
process it no longer parents ended.
"""

import json
import logging
import subprocess
import threading
import time
from dataclasses import asdict
from pathlib import Path

from . import containers, members, replicas, state
from .command import (  # noqa: F401 -- the names the agent's other modules import from here
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

logger = logging.getLogger("tuneplane-node")


class Commands(replicas.ServingCommands):
    def __init__(
        self,
        directory: Path,
        devices=lambda: [],
        storage_root: str | None = None,
        scope: str = "local",
        runtime=lambda: "",
    ):
        self.root = directory
        # The container runtime this node has now ("docker", "podman" or ""), for an image.
        self.runtime = runtime
        self.storage_root = storage_root
        # The agent's cgroups are under tuneplane/<scope>/ (the node id): its own only.
        self.scope = scope
        self.directory = directory / "commands"
        self.logs = directory / "logs"
        self.scratch = directory / "members"
        # The cards this node has now, as its inventory reports them ({index, uuid}).
        self.devices = devices
        self.children: dict[str, subprocess.Popen] = {}
        # The stream's reader accepts commands while the heartbeat thread refreshes them.
        self.lock = threading.RLock()

    def _path(self, command_id: str, suffix: str = ".json") -> Path:
        return self.directory / f"{command_id}{suffix}"

    def save(self, command: Command) -> None:
        state.ensure_private_dir(self.directory)
        state.write_private(self._path(command.command_id), json.dumps(asdict(command)).encode())

    def _load(self, path: Path) -> Command | None:
        try:
            return Command(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            logger.warning("unreadable command file %s left alone", path)
            return None

    def get(self, command_id: str) -> Command | None:
        path = self._path(command_id)
        return self._load(path) if COMMAND_ID.fullmatch(command_id) and path.exists() else None

    def known(self) -> list[Command]:
        """Every command in the state dir, with the state of its process now."""
        if not self.directory.is_dir():
            return []
        with self.lock:
            found = (self._load(path) for path in sorted(self.directory.glob("*.json")))
            return [self._refresh(command) for command in found if command is not None]

    def _refresh(self, command: Command) -> Command:
        if command.state != RUNNING:
            if command.kind == START and command.cleanup_wanted and not command.cleaned:
                self._clean(command)
            return command
        if command.kind == START:
            return self._refresh_member(command)
        if command.kind != "run":
            return command
        child = self.children.get(command.command_id)
        if child is not None:
            child.poll()  # reap it, so its pid is not a zombie
        exit_file = self._path(command.command_id, ".exit")
        if exit_file.exists():
            code = int(exit_file.read_text().strip() or VANISHED)
        elif command.pid and process_start_time(command.pid) == command.started:
            return command
        else:
            code = VANISHED
        command.state, command.exit_code = (SUCCEEDED if code == 0 else FAILED), code
        self.save(command)
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
        if not isinstance(payload, dict):
            payload = {}
        if kind == START:
            return self._start(command_id, payload)
        if kind in (STOP, CLEANUP):
            return self._on_member(command_id, kind, payload)
        argv = payload.get("argv")
        command = Command(command_id=command_id, kind=kind, argv=argv or [])
        self.save(command)
        if kind != "run" or not argv or not all(isinstance(arg, str) for arg in argv):
            command.state, command.exit_code = FAILED, VANISHED
            self.save(command)
            return command
        self._spawn(
            command,
            ["/bin/sh", "-c", WRAPPER, str(self._path(command_id, ".exit")), *argv],
            self._path(command_id, ".log"),
        )
        self.save(command)
        return command

    def _spawn(self, command: Command, argv: list[str], log_path: Path, **options) -> None:
        """Start a command's process in a session of its own, its output to its log; one
        that cannot start is failed, never retried here."""
        log = open(log_path, "ab")  # noqa: SIM115 -- the child's, closed below
        try:
            child = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                **options,
            )
        except OSError as error:
            logger.warning("%s %s could not start: %s", command.kind, command.command_id, error)
            command.state, command.exit_code = FAILED, VANISHED
            command.reason = "start_failed" if command.kind == START else ""
        else:
            self.children[command.command_id] = child
            command.pid, command.started = child.pid, process_start_time(child.pid)
        finally:
            log.close()

    # Members -------------------------------------------------------------------------------

    def _refusal(self, payload: dict) -> str:
        held = {
            card["index"] for other in self.known() if other.holds_cards for card in other.cards
        }
        return members.refusal(payload, self.devices(), held, self.runtime())

    def _start(self, command_id: str, payload: dict) -> Command:
        refusal = self._refusal(payload)
        command = Command(
            command_id=command_id,
            kind=START,
            argv=[],
            cards=[] if refusal else payload["cards"],
            boot_id=members.boot_id(),
            grace=float(payload.get("grace_seconds") or members.DEFAULT_GRACE),
        )
        if refusal:
            command.state, command.exit_code, command.reason = FAILED, VANISHED, "refused"
            command.cleaned = True
            logger.warning("member %s %s", command_id, refusal)
            self.save(command)
            return command
        command.serve = replicas.spec_of(payload)
        command.spec = payload if command.serve else None  # what a restart starts again
        self.save(command)  # persisted before it starts (R4)
        self._launch(command, payload)
        return command

    def _launch(self, command: Command, payload: dict) -> None:
        scratch = self.scratch / command.command_id
        state.ensure_private_dir(scratch)
        argv = members.argv_of(payload, scratch)
        command.argv = argv[:1]
        limits = (payload.get("cpus"), payload.get("memory_bytes"))
        if payload.get("image"):
            # The runtime confines the container; the wrapper and the runtime's client are
            # still in a cgroup named after the member (no limits), as any member is.
            command.container = self.runtime()
            command.oom_kills = containers.node_oom_kills() if limits[1] else None
            limits, argv = (
                (None, None),
                containers.run_argv(
                    command.container,
                    member_id=command.command_id,
                    scope=self.scope,
                    payload=payload,
                    env_names=members.own_env(payload, scratch, self.storage_root),
                    scratch=scratch,
                    storage_root=self.storage_root,
                    script=argv[1] if payload.get("script") else None,
                ),
            )
            containers.remove(command.container, command.command_id)  # a restart's last one
        command.confinement, procs = members.confine(self.cgroup(command.command_id), *limits)
        if command.container:
            command.confinement = f"container: {command.container}"
        state.ensure_private_dir(self.logs)
        self._spawn(
            command,
            ["/bin/sh", "-c", members.WRAPPER, "sh"]
            + [str(self._path(command.command_id, ".exit")), " ".join(procs), *argv],
            self.logs / f"{command.command_id}.log",
            cwd=scratch,
            env=members.member_env(payload, scratch, self.storage_root),
        )
        command.launched_at, command.boot_id = time.time(), members.boot_id()
        self.save(command)

    def _refresh_member(self, command: Command) -> Command:
        if command.restart_at is not None:
            return self._restart_due(command)
        child = self.children.get(command.command_id)
        if child is not None:
            child.poll()
        exit_file = self._path(command.command_id, ".exit")
        stopped = "stopped" if command.stop_at is not None else "exit"
        container = (
            containers.inspect(command.container, command.command_id)
            if (command.container and not self._leader(command))
            else None
        )
        if exit_file.exists():
            code = int(exit_file.read_text().strip() or VANISHED)
            reason = "oom" if self._oom(command) else stopped
        elif self._leader(command) or (container and container["running"]):
            self._escalate(command)
            return command
        elif container is not None and command.boot_id == members.boot_id():
            # Its wrapper gone (an adopted container, say): the container says how it ended.
            code, reason = container["exit_code"], "oom" if container["oom_killed"] else stopped
        elif command.stop_at is not None:
            code, reason = -9, "stopped"  # killed with its wrapper by the SIGKILL
        elif command.boot_id and command.boot_id != members.boot_id():
            code, reason = VANISHED, "node_rebooted"  # R6: never running after a reboot
        else:
            code, reason = VANISHED, "vanished"
        self.children.pop(command.command_id, None)
        if replicas.restart_after_exit(command, code, reason, time.time()):
            command.exit_code = code
            self.save(command)
            return command
        command.state = SUCCEEDED if code == 0 and reason == "exit" else FAILED
        command.exit_code, command.reason = code, reason
        if command.cleanup_wanted:
            self._clean(command)
        self.save(command)
        return command

    def _escalate(self, command: Command) -> None:
        """A stop under way: SIGKILL once the grace is over; unkillable a minute after."""
        if command.stop_at is None:
            return
        now = time.time()
        if command.killed_at is None and now >= command.stop_at + command.grace:
            members.signal_member(
                self._leader(command), self.cgroup(command.command_id), members.SIGKILL
            )
            if command.container:
                containers.kill(command.container, command.command_id)
            command.killed_at = now
            self.save(command)
        elif (
            command.killed_at is not None
            and now >= command.killed_at + members.UNKILLABLE_AFTER
            and command.reason != "unkillable"
        ):
            command.reason = "unkillable"
            self.save(command)

    def _stop(self, command: Command, grace: float) -> None:
        if command.state != RUNNING or command.stop_at is not None:
            return
        command.stop_at, command.grace = time.time(), grace
        self.save(command)
        members.signal_member(
            self._leader(command), self.cgroup(command.command_id), members.SIGTERM
        )
        if command.container:
            containers.stop(command.container, command.command_id, grace)
        self._escalate(command)

    def _clean(self, command: Command) -> None:
        """Whatever the member left is gone: its processes, cgroup and scratch dir (R7)."""
        cgroup = self.cgroup(command.command_id)
        members.signal_member(self._leader(command), cgroup, members.SIGKILL)
        gone = not command.container or containers.remove(command.container, command.command_id)
        members.release(cgroup)
        members.remove_scratch(self.scratch / command.command_id)
        command.cleaned = gone and not members.live_pids(cgroup)
        if not command.cleaned:
            # Something of it outlived SIGKILL: a minute on, it is unkillable (stuck in the
            # kernel); the node is cordoned for it and its cards stay held (DESIGN §7).
            now = time.time()
            command.killed_at = command.killed_at or now
            if now >= command.killed_at + members.UNKILLABLE_AFTER:
                command.reason = "unkillable"
        self.save(command)

    def _on_member(self, command_id: str, kind: str, payload: dict) -> Command:
        """A stop or cleanup: applied to the member it names, answered at once. A member
        this node does not know is still cleaned by its id (a lost state file, R7)."""
        command = Command(command_id=command_id, kind=kind, argv=[])
        member_id = payload.get("member")
        grace = payload.get("grace_seconds")
        grace = float(grace) if isinstance(grace, (int, float)) else members.DEFAULT_GRACE
        member = self.get(member_id) if isinstance(member_id, str) else None
        if member is None or member.kind != START:
            if kind == CLEANUP and isinstance(member_id, str) and COMMAND_ID.fullmatch(member_id):
                members.signal_member(None, self.cgroup(member_id), members.SIGKILL)
                if self.runtime():
                    containers.remove(self.runtime(), member_id)
                members.release(self.cgroup(member_id))
                members.remove_scratch(self.scratch / member_id)
            command.state, command.reason = SUCCEEDED, "unknown_member"
        else:
            member = self._refresh(member)
            self._stop(member, grace)
            if kind == CLEANUP:
                member.cleanup_wanted = True
                self.save(member)
                self._refresh(member)
            command.state = SUCCEEDED
        command.exit_code = 0
        self.save(command)
        return command

    def _leader(self, command: Command) -> int | None:
        """The member's process group, if its leader is still the process it started (a pid
        reused by another job's wrapper is never signalled)."""
        pid = command.pid
        if pid and process_start_time(pid) == command.started and not members.zombie(pid):
            return pid
        return None

    def _oom(self, command: Command) -> bool:
        """Whether the kernel's OOM killer ended it: in its container, or in its cgroup."""
        if command.container:
            found = containers.inspect(command.container, command.command_id)
            return containers.oom_ended(found, command.oom_kills, command.stop_at is not None)
        return members.oom_killed(self.cgroup(command.command_id))

    def cgroup(self, member_id: str) -> str:
        return f"{self.scope}/{member_id}"

    def log_tail(self, member_id: str, tail_bytes: int) -> bytes | None:
        if not COMMAND_ID.fullmatch(member_id):
            return None
        path = self.logs / f"{member_id}.log"
        return members.tail(path, tail_bytes) if path.exists() else None

    def forget_finished(self, command_ids) -> None:
        """Finished commands the console has reconciled need not be reported again; a
        member's only once it is cleaned (its cards are held till then, R7)."""
        with self.lock:
            for command_id in command_ids:
                path = self._path(command_id)
                command = self._load(path) if path.exists() else None
                if command is not None and command.state != RUNNING and not command.holds_cards:
                    # The output log stays for the machine's administrator.
                    for suffix in (".json", ".exit"):
                        self._path(command_id, suffix).unlink(missing_ok=True)

    def expire_logs(self, retention_seconds: float) -> None:
        keep = {command.command_id for command in self.known()}
        for path in members.expired_logs(self.logs, retention_seconds, keep):
            path.unlink(missing_ok=True)
