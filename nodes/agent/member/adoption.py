"""A member whose state file is lost (R6) is rebuilt from what it left running: everything a
member creates is named by its id — its cgroup under the agent's scope (the node id), and a
container's name and labels (``tuneplane.member``, ``tuneplane.scope``)."""

import logging

from ..command import COMMAND_ID, process_start_time
from . import cgroups, containers, launch
from .record import Member
from .runner import Runner

logger = logging.getLogger("tuneplane-node")


def adopt_orphans(runner: Runner) -> list[str]:
    """R6: members whose state file is lost are found by what they left running — a
    cgroup named by their id with processes in it, or a running container labelled with
    it — and adopted as running, so that the console's reconcile keeps them rather than
    calling them vanished."""
    adopted = []
    store, runtime = runner.store, runner.runtime()
    in_containers = containers.members(runtime, runner.scope) if runtime else {}
    with store.lock:
        for member_id in cgroups.cgroup_members(runner.scope):
            cgroup = runner.cgroup(member_id)
            pids = cgroups.cgroup_pids(cgroup)
            if not COMMAND_ID.fullmatch(member_id) or store.get(member_id) or not pids:
                continue
            leader = next((pid for pid in pids if cgroups.leads_group(pid)), pids[0])
            member = Member(
                command_id=member_id,
                pid=leader,
                started=process_start_time(leader),
                boot_id=launch.boot_id(),
                confinement=cgroups.cgroup_paths(cgroup)[0],
                reason="adopted",
            )
            if member_id in in_containers:
                member.container, member.confinement = runtime, f"container: {runtime}"
            store.save(member)
            adopted.append(member_id)
        for member_id, running in in_containers.items():
            if not running or not COMMAND_ID.fullmatch(member_id) or store.get(member_id):
                continue
            store.save(
                Member(
                    command_id=member_id,
                    boot_id=launch.boot_id(),
                    confinement=f"container: {runtime}",
                    container=runtime,
                    reason="adopted",
                )
            )
            adopted.append(member_id)
    for member_id in adopted:
        logger.warning("member %s had no state file; adopted from what it runs", member_id)
    return adopted
