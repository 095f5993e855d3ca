"""A member whose state file is lost (R6) is rebuilt from what it left running: everything a
member creates is named by its id — its cgroup under the agent's scope (the node id)."""

import logging

from . import members
from .commands import COMMAND_ID, START, Command, Commands, _started

logger = logging.getLogger("tuneplane-node")


def adopt_orphans(commands: Commands) -> list[str]:
    """R6: members whose state file is lost are found by what they left running — a
    cgroup named by their id, with processes in it — and adopted as running, so that the
    console's reconcile keeps them rather than calling them vanished."""
    adopted = []
    with commands.lock:
        for member_id in members.cgroup_members(commands.scope):
            cgroup = commands.cgroup(member_id)
            pids = members.cgroup_pids(cgroup)
            if not COMMAND_ID.fullmatch(member_id) or commands.get(member_id) or not pids:
                continue
            leader = next((pid for pid in pids if members.leads_group(pid)), pids[0])
            commands.save(
                Command(
                    command_id=member_id,
                    kind=START,
                    argv=[],
                    pid=leader,
                    started=_started(leader),
                    boot_id=members.boot_id(),
                    confinement=members.cgroup_paths(cgroup)[0],
                    reason="adopted",
                )
            )
            adopted.append(member_id)
    for member_id in adopted:
        logger.warning("member %s had no state file; adopted from its cgroup", member_id)
    return adopted
