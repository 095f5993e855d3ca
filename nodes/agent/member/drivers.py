"""How a member runs: as a process confined by its cgroup, or in a container under the
node's runtime. Both are started by the same wrapper, in a session and a cgroup named after
the member, whose process group the runner signals; a driver adds what its kind needs to
start, watch, stop and remove it."""

from pathlib import Path

from .. import state
from ..wire import MemberSpec
from . import cgroups, containers, launch
from .record import Member


class ProcessDriver:
    """The member is the wrapper's child: its cgroup confines it, its exit file says how it
    ended, its cgroup says whether the OOM killer ended it."""

    runtime = ""

    def launch(self, member: Member, spec: MemberSpec, argv, scratch: Path, **_) -> tuple:
        """The argv the wrapper runs and the cgroup's limits (cpus, memory bytes)."""
        return argv, (spec.cpus, spec.memory_bytes)

    def confinement(self, cgroup_confinement: str) -> str:
        return cgroup_confinement

    def container_state(self, member: Member) -> dict | None:
        return None

    def oom(self, member: Member, cgroup: str) -> bool:
        return cgroups.oom_killed(cgroup)

    def terminate(self, member: Member, grace: float) -> None:
        """Nothing beyond the SIGTERM to its group and cgroup."""

    def kill(self, member: Member) -> None:
        """Nothing beyond the SIGKILL to its group and cgroup."""

    def remove(self, member_id: str) -> bool:
        return True


class ContainerDriver(ProcessDriver):
    """The wrapper runs the runtime's foreground ``run``; the container is the runtime's
    child, so whatever ends it goes through the runtime by the container's name. The
    runtime confines it; the wrapper's cgroup has no limits."""

    def __init__(self, runtime: str):
        self.runtime = runtime

    def launch(
        self, member, spec, argv, scratch, *, scope, env, storage_root, env_file, script_at
    ) -> tuple:
        member.oom_kills = containers.node_oom_kills() if spec.memory_bytes else None
        state.write_private(env_file, launch.env_file_text(env).encode())
        run = containers.run_argv(
            self.runtime,
            member_id=member.command_id,
            scope=scope,
            spec=spec,
            env_file=env_file,
            scratch=scratch,
            storage_root=storage_root,
            script=script_at if spec.script else None,
            uid=member.uid,
        )
        containers.remove(self.runtime, member.command_id)  # a restart's last one
        return run, (None, None)

    def confinement(self, cgroup_confinement: str) -> str:
        return f"container: {self.runtime}"

    def container_state(self, member: Member) -> dict | None:
        return containers.inspect(self.runtime, member.command_id)

    def oom(self, member: Member, cgroup: str) -> bool:
        found = containers.inspect(self.runtime, member.command_id)
        return containers.oom_ended(found, member.oom_kills, member.stop_at is not None)

    def terminate(self, member: Member, grace: float) -> None:
        containers.stop(self.runtime, member.command_id, grace)

    def kill(self, member: Member) -> None:
        containers.kill(self.runtime, member.command_id)

    def remove(self, member_id: str) -> bool:
        return containers.remove(self.runtime, member_id)


def driver_of(member: Member) -> ProcessDriver:
    return ContainerDriver(member.container) if member.container else ProcessDriver()
