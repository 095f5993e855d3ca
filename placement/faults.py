"""When hardware fails (DESIGN §9, H1–H3): whose an attempt's end was, what of the machine
its next attempts stay away from, and whether the job tries again — pure functions of
plain data, with no database and no clock of their own (tests/placement/test_faults.py).
placement.services.runs reads the rows, asks here, and writes the answer, audited.

H1. An attempt's end is ``infrastructure`` when any of its members ended by the machine:

    its node gone (still unknown when the attempt ended) or given up (lost, abandoned) ┐
    the member vanished, or its node rebooted under it                                   │
    a fatal fault judged on one of its cards during the attempt (telemetry's XID, ECC,   ├ the
      a card fallen off the bus), however the member then ended                          │ machine's
    the agent could not start it (refused, start_failed; exit 125 under an OCI or        │
      container runtime: the runtime's own code for "could not run it")                 ┘
    a gang deadline missed while no member had ended on its own

— and a gang's other members, which end because a peer did, share that class. Otherwise it
is ``user``: its success, its own non-zero exit, its OOM, a cancel, a gang deadline missed
after a member exited. A preempted attempt has no class (Q6: neither).

H2. An infrastructure end never spends ``max_attempts``: it retries while the job's
infrastructure ends are at most its budget (``infra_retries``), after a backoff (30 s
doubling to 30 min by default), away from what failed it — only the failing cards where the
rest of their node is healthy, else the whole node.

H3. A user end retries only when it is an exit code the job listed (``retry.on_exit_codes``)
or a missed gang deadline (R9), while its user ends are fewer than ``max_attempts``; any
other end fails the job at once.
"""

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings

from .choices import RUN_LIVE, EndClass, RunState

# A member's own reason that is the machine's doing (placement.services.members.reported_as).
MACHINE_REASONS = frozenset(
    {"lost", "abandoned", "vanished", "node_rebooted", "node_gone", "refused", "start_failed"}
)
# What an OCI runtime (runc, crun: the member's keeper) and a container CLI (docker, podman)
# exit with when they could not run the member at all (nodes/agent/member/shim.py).
RUNTIME_START_FAILED = 125
_UNDER_RUNTIME = re.compile(r"(runc|crun|container):")


def under_runtime(confinement: str) -> bool:
    """Whether the member's reported confinement says it ran under a runtime, whose exit
    125 is the runtime's, not the member's."""
    return bool(_UNDER_RUNTIME.match(confinement or ""))


@dataclass(frozen=True)
class MemberEnd:
    """What the console knows of one member when its attempt ends."""

    node: str
    state: str  # RunState
    reason: str = ""
    exit_code: int | None = None
    started: bool = False  # it was reported running at least once
    runtime: bool = False  # it ran under an OCI or container runtime
    # Its cards judged unhealthy since its attempt began: ((index, uuid), …).
    faulted: tuple = ()
    # Whether its node has a healthy card beside those: only the cards are then excluded.
    others_healthy: bool = True
    node_gone: bool = False  # its node declared gone when the attempt ended


def member_fault(member: MemberEnd) -> str:
    """The machine's fault that ended the member, as a word ("" when it is not the
    machine's): what its attempt's class and its job's exclusions follow."""
    if member.faulted and member.state != RunState.SUCCEEDED:
        return "card_fault"
    if member.state in (RunState.LOST, RunState.ABANDONED):
        return member.reason or str(member.state)
    if member.state == RunState.FAILED and member.reason in MACHINE_REASONS:
        return member.reason
    if (
        member.state == RunState.FAILED
        and member.reason == "exit"
        and member.exit_code == RUNTIME_START_FAILED
        and member.runtime
    ):
        return "start_failed"
    if member.node_gone and member.state in (RunState.UNKNOWN, RunState.FAILED):
        return "node_gone"
    return ""


def end_class(state: str, reason: str, members: list[MemberEnd]) -> str:
    """H1: the class of an attempt that ended in ``state`` for ``reason``, from its members."""
    if state in (RunState.STARTING, RunState.RUNNING, RunState.UNKNOWN, RunState.PREEMPTED):
        return ""
    if state in (RunState.SUCCEEDED, RunState.CANCELLED):
        return EndClass.USER  # it did its work, or it was asked to stop
    if any(member_fault(member) for member in members):
        return EndClass.INFRASTRUCTURE
    if reason == "gang_deadline":
        # Late because a member had already exited (it ran and ended on its own): the job's.
        exited = any(m.state in (RunState.SUCCEEDED, RunState.FAILED) for m in members)
        return EndClass.USER if exited else EndClass.INFRASTRUCTURE
    if state in (RunState.FAILED, RunState.LOST) and reason in MACHINE_REASONS:
        return EndClass.INFRASTRUCTURE
    return EndClass.USER


@dataclass(frozen=True)
class Excluded:
    """What an infrastructure end lays to: whole nodes, and cards as (node, index, uuid)."""

    nodes: dict  # node id → the fault
    cards: dict  # (node id, index, uuid) → the fault


def excluded(reason: str, members: list[MemberEnd]) -> Excluded:
    """H2: the nodes and cards an infrastructure end of an attempt was laid to. A member's
    faulted cards alone where the rest of its node is healthy; its whole node for any other
    fault of the machine; a gang late with no member ended: the nodes whose members never
    started. A peer that ended because of another's fault lays nothing to its own node."""
    nodes: dict = {}
    cards: dict = {}
    for member in members:
        fault = member_fault(member)
        if fault == "card_fault" and member.others_healthy:
            for index, uuid in member.faulted:
                cards[(member.node, index, uuid)] = fault
        elif fault:
            nodes[member.node] = fault
    if reason == "gang_deadline" and not nodes and not cards:
        for member in members:
            if not member.started:
                nodes[member.node] = "gang_deadline: never started"
    return Excluded(nodes, cards)


def infra_retries_of(fleet) -> int:
    """H2: a job's budget of infrastructure ends on ``fleet``: its config's infra_retries,
    else TUNEPLANE_INFRA_RETRIES."""
    return (fleet.config or {}).get("infra_retries", settings.TUNEPLANE_INFRA_RETRIES)


def infra_backoff(infra_ends: int, first: int, most: int) -> timedelta:
    """H2: how long the retry after the job's ``infra_ends``-th infrastructure end waits:
    ``first`` seconds, doubling, at most ``most``."""
    return timedelta(seconds=min(most, first * 2 ** min(max(0, infra_ends - 1), 32)))


@dataclass(frozen=True)
class Next:
    """What the job does after an attempt's end: queued again (``retry``) or failed, with
    the job's reason; an infrastructure retry's backoff."""

    retry: bool
    reason: str
    backoff: timedelta | None = None


def next_after(
    *,
    end: str,
    reason: str,
    exit_code: int | None,
    user_ends: int,
    max_attempts: int,
    infra_ends: int,
    infra_retries: int,
    on_exit_codes=(),
    backoff_first: int = 30,
    backoff_max: int = 1800,
) -> Next:
    """H2, H3, R9: after a failed or lost attempt of class ``end`` — with the job's user and
    infrastructure ends counted, this one included — whether the job tries again."""
    if end == EndClass.INFRASTRUCTURE:
        if infra_ends <= infra_retries:
            wait = infra_backoff(infra_ends, backoff_first, backoff_max)
            return Next(True, f"retrying after {reason}"[:64], wait)
        return Next(False, f"{reason}; infra_retries spent"[:64])
    listed = reason == "exit" and exit_code is not None and exit_code in set(on_exit_codes)
    if (listed or reason == "gang_deadline") and user_ends < max_attempts:
        said = f"exit {exit_code}" if listed else reason
        return Next(True, f"retrying after {said}"[:64])
    return Next(False, reason)


def deciding_exit_code(reason: str, members: list[MemberEnd]) -> int | None:
    """The exit code of the member whose end ended the attempt (the first by rank that
    failed for the attempt's reason)."""
    return next(
        (m.exit_code for m in members if m.state == RunState.FAILED and m.reason == reason),
        None,
    )


def work_lost(
    state: str, started_at: datetime | None, checkpoints, ended_at: datetime | None
) -> float | None:
    """H4: what an attempt that ended without succeeding lost, in seconds — what it ran
    since its last checkpoint (any member's; before its start none counts), or since its
    start without one. None while it runs, when it succeeded, or never started."""
    if state in (RunState.SUCCEEDED, *RUN_LIVE) or started_at is None or ended_at is None:
        return None
    kept = max((at for at in checkpoints if at is not None and at > started_at), default=None)
    return max((ended_at - (kept or started_at)).total_seconds(), 0.0)


# H8: a cluster Fleet's manager (Slurm, KubeRay) runs the job; its own words say how an
# attempt there ended. Slurm's base states (and, as v0.0.38 spells one word, its flags).
SLURM_LIVE = frozenset(
    {
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "CONFIGURING",
        "COMPLETING",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "POWER_UP_NODE",
        "UPDATE_DB",
        "RESV_DEL_HOLD",
    }
)
# The manager put it back in its queue itself — Slurm's requeue after a node failure (and
# `scontrol requeue`, RequeueExit, RequeueExitHold's SPECIAL_EXIT): the same attempt, never a
# class, never an attempt spent.
SLURM_REQUEUED = frozenset({"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT"})
# The machine's: a node that failed under the job, one that never booted for it, a launch
# slurmd could not make.
SLURM_MACHINE_ENDS = frozenset({"NODE_FAIL", "BOOT_FAIL", "LAUNCH_FAILED"})
# The job's own: its non-zero exit, its memory, its time limit, its deadline.
SLURM_OWN_ENDS = frozenset({"FAILED", "OUT_OF_MEMORY", "TIMEOUT", "DEADLINE"})
# Slurm's state_reason for a job FAILED by its node rather than by its own exit: the node
# went down under it, its launch failed there, the node's prolog failed.
SLURM_MACHINE_REASONS = frozenset({"NodeDown", "JobLaunchFailure", "Prolog", "NodeFail"})
# KubeRay's status.reason for a RayJob it failed: the submitter could not hand the Ray job to
# its cluster (SubmissionFailed) is the manager's, as an agent unable to start a member is;
# the app's own failure (AppFailed), the job's deadline, a manifest KubeRay refused and a
# status KubeRay lost track of (JobDeploymentStatusTransitionGracePeriodExceeded: the job may
# have run to its end) are not.
KUBERAY_MACHINE_REASONS = frozenset({"SubmissionFailed"})
# What Kubernetes and Ray say of a pod or node lost under the job, in the RayJob's
# status.message (Ray's job message, which KubeRay copies): a pod evicted (the kubelet's
# "Evicted", "The node was low on resource"; the taint manager's DeletionByTaintManager; a
# DisruptionTarget), a Ray node dead with its pod (NodeDiedError, "its node has died", "the
# actor's node was terminated"), the job's supervisor actor gone with its node.
KUBERAY_NODE_LOST = re.compile(
    r"evicted|the node was low on resource|DeletionByTaintManager|DisruptionTarget"
    r"|TerminationByKubelet|NodeDiedError|node (?:has )?died|node was terminated"
    r"|Job supervisor actor died|node .{0,40}(?:not ready|lost|unreachable)",
    re.IGNORECASE,
)


def manager_end_class(state: str, *, reason: str = "", message: str = "") -> str:
    """H1 on a cluster Fleet (H8): the class of a job's end as its manager reads it —
    ``state`` in the manager's words (Slurm's job_state, KubeRay's jobStatus), with its
    ``reason`` (Slurm's state_reason, KubeRay's status.reason) and ``message`` (KubeRay's
    status.message). "" while it is live or requeued by the manager, and for a preemption
    (Q6: neither)."""
    word = (state or "").upper()
    if word in ("COMPLETED", "SUCCEEDED", "COMPLETE", "CANCELLED", "STOPPED"):
        # It did its work, or it was asked to stop (KubeRay's STOPPED: a RayJob deleted).
        return EndClass.USER
    if word in SLURM_MACHINE_ENDS:
        return EndClass.INFRASTRUCTURE
    if word in SLURM_OWN_ENDS:
        if reason in SLURM_MACHINE_REASONS or reason in KUBERAY_MACHINE_REASONS:
            return EndClass.INFRASTRUCTURE
        if word == "FAILED" and KUBERAY_NODE_LOST.search(message or ""):
            return EndClass.INFRASTRUCTURE
        return EndClass.USER
    return ""  # live, requeued, preempted, or a word not known
