"""A1 for running work (DESIGN §7, R10): the allocator's pass, a member's report followed
into its attempt and job, cancel, and the node commands they are made of. Merged into
SCENARIOS by test_audit_completeness."""

from django.test import TestCase

from audit.services import Actor
from nodes.choices import CommandKind
from nodes.models import Node, NodeCommand
from nodes.services import commands, control, cordons
from placement import handover
from placement.choices import JOB_LIFECYCLE
from placement.models import Member, TrainingJob
from placement.services import (
    allocator,
    members,
    reconcile,
    reports,
    runs,
    submission,
)
from tests.conftest import H100_DEVICE_INVENTORY, SYSTEM
from tuneplane.lifecycle import move

from . import telemetry_scenarios
from .scenarios import RAYJOB, Scenario, changed, created, tasks_run_at_once

STARTED = (
    created("attempt.created"),
    created("member.created"),
    created("node_command.created"),
    changed("trainingjob.starting"),
)


def _queued(w) -> TrainingJob:
    """A member's job, queued on a node Fleet with one placeable node of 8 cards by UUID."""
    placeable = w.placeable()
    control.node_report_inventory(node_id=placeable.id, inventory=H100_DEVICE_INVENTORY)
    return submission.training_job_submit(
        actor=Actor.of_user(w.member), project="ml", name="sft", command=["true"], cards=2
    )


def _started(w) -> Member:
    job = _queued(w)
    allocator.allocate(fleet_id=job.fleet_id)
    return Member.objects.select_related("command").get(attempt__training_job=job)


def allocate(w):
    job = _queued(w)
    return lambda: allocator.allocate(fleet_id=job.fleet_id)


def allocate_all(w):
    _queued(w)
    return allocator.allocate_all


def member_running(w):
    """The node reports the start command running: the member, its attempt and its job run."""
    member = _started(w)
    NodeCommand.objects.filter(pk=member.command_id).update(state="running")
    command = NodeCommand.objects.get(pk=member.command_id)
    return lambda: runs.attempt_member_reported(member.attempt_id, command, {"state": "pending"})


def member_reported(w):
    """The same report, as the one observer placement registers with nodes hears it."""
    member = _started(w)
    NodeCommand.objects.filter(pk=member.command_id).update(state="running")
    command = NodeCommand.objects.get(pk=member.command_id)
    return lambda: reports.command_observed(command, {"state": "pending"})


def member_follow(w):
    """The member alone follows its command: its attempt is its owner's to settle."""
    member = _started(w)
    NodeCommand.objects.filter(pk=member.command_id).update(state="running")
    command = NodeCommand.objects.get(pk=member.command_id)
    return lambda: members.member_follow(
        member, command, {"state": "pending"}, actor=SYSTEM, fleet_id=member.attempt.fleet_id
    )


def member_release(w):
    """A member whose node confirmed its cleanup: its cards go."""
    member = _started(w)
    NodeCommand.objects.filter(pk=member.command_id).update(
        state="succeeded", exit_code=0, cleaned_at=member.attempt.created_at
    )
    command = NodeCommand.objects.get(pk=member.command_id)
    return lambda: members.member_release(member, command, SYSTEM, member.attempt.fleet_id)


def members_stop(w):
    member = _started(w)
    return lambda: members.members_stop([member])


def members_send(w):
    member = _started(w)
    return lambda: members.members_send(CommandKind.STOP, [member])


def members_clean(w):
    member = _started(w)
    Member.objects.filter(pk=member.pk).update(state="succeeded")
    member.refresh_from_db()
    return lambda: members.members_clean([member])


def attempt_settle(w):
    """An attempt whose only member failed: the attempt fails, its job too, and the member
    is cleaned up."""
    member = _started(w)
    Member.objects.filter(pk=member.pk).update(state="failed", reason="exit")
    return lambda: runs.attempt_settle(member.attempt_id)


def attempt_end(w):
    """H1: an attempt ended with its class, by the gang-deadline sweep's path."""
    member = _started(w)
    job, attempt, members_ = runs.locked_run(member.attempt_id)
    return lambda: runs.attempt_end(attempt, members_, "failed", "gang_deadline", job.created_at)


def job_excluded_clear(w):
    """H2: an administrator clears what a job's next attempts stay away from."""
    job = _queued(w)
    TrainingJob.objects.filter(pk=job.pk).update(
        excluded={"nodes": [{"node": "n", "reason": "lost", "attempt": 1, "at": "x"}]}
    )
    job.refresh_from_db()
    return lambda: runs.job_excluded_clear(actor=Actor.of_user(w.admin), job=job)


def lifecycle_move(w):
    job = _queued(w)
    return lambda: move(
        job, JOB_LIFECYCLE, "cancelled", actor=SYSTEM, action="trainingjob.cancelled"
    )


def job_move(w):
    job = _queued(w)
    return lambda: runs.job_move(job, "cancelled", reason="cancelled", now=job.created_at)


def cancel_queued(w):
    job = _queued(w)
    return lambda: runs.job_cancel(actor=Actor.of_user(w.member), job=job)


def cancel_running(w):
    member = _started(w)
    job = member.attempt.training_job
    return lambda: runs.job_cancel(actor=Actor.of_user(w.member), job=job)


def commands_create_many(w):
    node = w.node()
    batch = [(node.id, CommandKind.RUN, {"argv": ["true"]})] * 2
    return lambda: commands.node_commands_create_many(actor=SYSTEM, commands=batch)


def command_lost(w):
    """A running member whose node has been gone past the reconcile deadline: unknown."""
    member = _started(w)
    NodeCommand.objects.filter(pk=member.command_id).update(state="running")
    Member.objects.filter(pk=member.pk).update(state="unknown", reason="node_gone")
    command = NodeCommand.objects.get(pk=member.command_id)
    return lambda: commands.node_command_lost(command=command, reason="lost")


def command_cleaned_by_id(w):
    """A member that succeeded, with its attempt and job, and whose cleanup was asked for."""
    member = _started(w)
    NodeCommand.objects.filter(pk=member.command_id).update(state="succeeded", exit_code=0)
    Member.objects.filter(pk=member.pk).update(
        state="succeeded", cleanup_requested_at=member.attempt.created_at
    )
    member.attempt.__class__.objects.filter(pk=member.attempt_id).update(state="succeeded")
    TrainingJob.objects.filter(pk=member.attempt.training_job_id).update(state="succeeded")
    command = NodeCommand.objects.get(pk=member.command_id)
    return lambda: commands.node_command_cleaned_by_id(command=command)


RUNNING = (changed("member.running"), changed("attempt.running"), changed("trainingjob.running"))


def reconcile_gone(w):
    """A running member whose node the liveness sweep declared gone."""
    member = _started(w)
    NodeCommand.objects.filter(pk=member.command_id).update(state="running")
    Member.objects.filter(pk=member.pk).update(state="running")
    Node.objects.filter(pk=member.node_id).update(scheduling_state="gone")
    return reconcile.members_reconcile


def observe_unkillable(w):
    """A running member its node reported unkillable."""
    member = _started(w)
    NodeCommand.objects.filter(pk=member.command_id).update(state="running", reason="unkillable")
    return lambda: cordons.node_observe_unkillable(node_id=member.node_id)


def _handed_over_cancelled(w):
    """A job its kubernetes Fleet's manager has, whose cancel was asked for."""
    job, replay = w.cluster_job()
    handover.cluster_job_handover(job.pk)
    replay.serve("DELETE", RAYJOB, {"kind": "Status", "status": "Success"})
    TrainingJob.objects.filter(pk=job.pk).update(cancel_requested_at=job.created_at)
    return TrainingJob.objects.get(pk=job.pk)


def cluster_job_cancel(w):
    job = _handed_over_cancelled(w)
    return lambda: handover.cluster_job_cancel(job.pk)


def cluster_job_cancel_on_commit(w):
    job = _handed_over_cancelled(w)

    def call():
        with tasks_run_at_once(), TestCase.captureOnCommitCallbacks(execute=True):
            handover.cluster_job_cancel_on_commit(job)

    return call


SCENARIOS = {
    "placement.handover.cluster_job_cancel": Scenario(
        cluster_job_cancel, (changed("trainingjob.cancel_sent"),)
    ),
    # It dispatches the cancel through the broker: run at once here.
    "placement.handover.cluster_job_cancel_on_commit": Scenario(
        cluster_job_cancel_on_commit, (changed("trainingjob.cancel_sent"),)
    ),
    "nodes.services.cordons.node_observe_unkillable": Scenario(
        observe_unkillable, (changed("node.cordoned"),)
    ),
    "placement.services.reconcile.members_reconcile": Scenario(
        reconcile_gone, (changed("member.unknown"),)
    ),
    "placement.services.allocator.allocate": Scenario(allocate, STARTED),
    "placement.services.allocator.allocate_all": Scenario(allocate_all, STARTED),
    "placement.services.runs.attempt_member_reported": Scenario(member_running, RUNNING),
    # Through the one observer placement registers with nodes: the same moves.
    "placement.services.runs.attempt_member_reported/observed": Scenario(member_reported, RUNNING),
    "tuneplane.lifecycle.move": Scenario(lifecycle_move, (changed("trainingjob.cancelled"),)),
    "placement.services.members.member_follow": Scenario(
        member_follow, (changed("member.running"),)
    ),
    "placement.services.members.member_release": Scenario(
        member_release, (changed("member.cleaned"),)
    ),
    "placement.services.members.members_stop": Scenario(
        members_stop, (created("node_command.created"),)
    ),
    "placement.services.members.members_send": Scenario(
        members_send, (created("node_command.created"),)
    ),
    "placement.services.members.members_clean": Scenario(
        members_clean, (created("node_command.created"),)
    ),
    "placement.services.runs.attempt_settle": Scenario(
        attempt_settle,
        (changed("attempt.failed"), changed("trainingjob.failed"), created("node_command.created")),
    ),
    "placement.services.runs.job_move": Scenario(job_move, (changed("trainingjob.cancelled"),)),
    "placement.services.runs.attempt_end": Scenario(attempt_end, (changed("attempt.failed"),)),
    "placement.services.runs.job_excluded_clear": Scenario(
        job_excluded_clear, (changed("trainingjob.excluded_cleared"),)
    ),
    "placement.services.runs.job_cancel": Scenario(
        cancel_queued, (changed("trainingjob.cancelled"),)
    ),
    # Running: the request is recorded, and each live member gets a stop command.
    "placement.services.runs.job_cancel/running": Scenario(
        cancel_running,
        (changed("trainingjob.cancel_requested"), created("node_command.created")),
    ),
    "nodes.services.commands.node_commands_create_many": Scenario(
        commands_create_many, (created("node_command.created"), created("node_command.created"))
    ),
    # The console gives up on a member (R8): the command, then the member, attempt and job,
    # and a cleanup for whenever its node returns (R9).
    "nodes.services.commands.node_command_lost": Scenario(
        command_lost,
        (
            changed("node_command.lost"),
            changed("member.lost"),
            changed("attempt.lost"),
            changed("trainingjob.queued"),
            created("node_command.created"),
        ),
    ),
    "nodes.services.commands.node_command_cleaned_by_id": Scenario(
        command_cleaned_by_id, (changed("node_command.cleaned"), changed("member.cleaned"))
    ),
}
SCENARIOS.update(telemetry_scenarios.SCENARIOS)
