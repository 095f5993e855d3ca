"""A1 for sharing a Fleet (placement.services.quotas, Q1; placement.services.preempting,
Q6, Q7): an administrator replacing a Fleet's quotas records one event, with the quotas
before and after; a preemption one on its victim, one on its preemptor and the victim's stop
command. Merged into SCENARIOS by test_audit_completeness."""

from datetime import timedelta

from django.utils import timezone

from audit.services import Actor
from placement.models import Attempt, Member
from placement.services import allocator, quotas, runs, submission
from placement.services.quotas import QuotaSpec
from tests.conftest import SYSTEM
from tuneplane.models import Membership, Project

from .scenarios import Scenario, changed, created

READS = {
    "placement.services.preempting.named",  # a key as its records name it
    "placement.services.preempting.running_jobs",  # reads the running jobs
    "placement.services.runs.attempts_used",  # counts a job's attempts
    "placement.services.allocator.allocate_preview",  # a pass in a savepoint rolled back
    "placement.handover.followed",  # a pure mapping of a manager's state
    "placement.services.quotas.fleet_quotas",  # reads the rows
    "placement.services.quotas.quota_rows",  # reads the rows and what each holds
}


def quotas_replace(w):
    fleet = w.fleet()
    quotas.quotas_replace(actor=Actor.of_user(w.admin), fleet=fleet, specs=[QuotaSpec("ml")])
    return lambda: quotas.quotas_replace(
        actor=Actor.of_user(w.admin),
        fleet=fleet,
        specs=[QuotaSpec("ml", guaranteed=8, limit=16, weight=2)],
    )


def preempt(w):
    """ml's job has run an hour on borrowed cards; cv, guaranteed the node's cards, waits
    for them: the pass's preemption (called by the allocator, with the pass's reading)."""
    fleet = w.fleet()
    w.placeable()
    cv = Project.objects.create(slug="cv", name="Vision")
    Membership.objects.create(project=cv, user=w.member)
    quotas.quotas_replace(actor=SYSTEM, fleet=fleet, specs=[QuotaSpec("cv", guaranteed=8)])

    def submit(project):
        return submission.training_job_submit(
            actor=Actor.of_user(w.member), project=project, name="j", command=["x"], cards=8
        )

    borrower = submit("ml")
    allocator.allocate(fleet_id=fleet.id)
    member = Member.objects.select_related("command").get(attempt__training_job=borrower)
    command = member.command
    command.state = "running"
    command.save(update_fields=["state"])
    runs.attempt_member_reported(member.attempt_id, command, {"state": "pending"})
    Attempt.objects.update(started_at=timezone.now() - timedelta(hours=1))
    submit("cv")
    return lambda: allocator.allocate(fleet_id=fleet.id)


SCENARIOS = {
    "placement.services.preempting.preempt": Scenario(
        preempt,
        (
            changed("trainingjob.preempting"),
            changed("trainingjob.preempts"),
            created("node_command.created"),
        ),
    ),
    "placement.services.quotas.quotas_replace": Scenario(
        quotas_replace, (changed("fleet.quotas_replaced"),)
    ),
}
