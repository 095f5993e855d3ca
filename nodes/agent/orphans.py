"""A member whose state file is lost (R6) is rebuilt from what it left running: everything a
member creates is named by its id — its cgroup under the agent's scope (the node id), and a
container's name and labels (``tuneplane.member``, ``tuneplane.scope``)."""

import logging

from . import containers, members
from .command import process_start_time
from .commands import COMMAND_ID, START, Command, Commands

logger = logging.getLogger("tuneplane-node")


def adopt_orphans(commands: Commands) -> list[str]:
    """R6: members whose state file is lost are found by what they left running — a
    cgroup named by their id with processes in it, or a running container labelled with
    it — and adopted as running, so that the console's reconcile keeps them rather than
    calling them vanished."""
    adopted = []
    runtime = commands.runtime()
    in_containers = containers.members(runtime, commands.scope) if runtime else {}
    with commands.lock:
        for member_id in members.cgroup_members(commands.scope):
            cgroup = commands.cgroup(member_id)
            pids = members.cgroup_pids(cgroup)
            if not COMMAND_ID.fullmatch(member_id) or commands.get(member_id) or not pids:
                continue
            leader = next((pid for pid in pids if members.leads_group(pid)), pids[0])
            command = Command(
                command_id=member_id,
                kind=START,
                argv=[],
                pid=leader,
                started=process_start_time(leader),
                boot_id=members.boot_id(),
                confinement=members.cgroup_paths(cgroup)[0],
                reason="adopted",
            )
            if member_id in in_containers:
                command.container, command.confinement = runtime, f"container: {runtime}"
            commands.save(command)
            adopted.append(member_id)
        for member_id, running in in_containers.items():
            if not running or not COMMAND_ID.fullmatch(member_id) or commands.get(member_id):
                continue
            commands.save(
                Command(
                    command_id=member_id,
                    kind=START,
                    argv=[],
                    boot_id=members.boot_id(),
                    confinement=f"container: {runtime}",
                    container=runtime,
                    reason="adopted",
                )
            )
            adopted.append(member_id)
    for member_id in adopted:
        logger.warning("member %s had no state file; adopted from what it runs", member_id)
    return adopted
