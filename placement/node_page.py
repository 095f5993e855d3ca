"""What runs on a node, for its admin page (issue 49): each live member with the job,
deployment, session or episode it belongs to, its project, its cards and since when. One
query whatever the number of members."""

from django.urls import reverse

from .choices import RUN_LIVE
from .models import Member

OWNERS = (
    "attempt__training_job",
    "attempt__lifecycle_job",
    "revision__deployment",
    "session",
    "episode__environment",
)


def _owner(member):
    """The workload a member runs for, and what the page calls it."""
    if member.attempt_id:
        attempt = member.attempt
        job = attempt.training_job or attempt.lifecycle_job
        shown = f"{job._meta.verbose_name} {job.name}: attempt {attempt.number}"
        return job, f"{shown}, rank {member.rank}"
    if member.revision_id:
        deployment = member.revision.deployment
        return deployment, f"deployment {deployment.name}: replica {member.rank}"
    if member.session_id:
        return member.session, f"playground session {member.session.name}"
    environment = member.episode.environment
    return environment, f"environment {environment.name}: episode {member.episode.number}"


def node_members_section(node) -> dict | None:
    members = (
        Member.objects.filter(node=node, state__in=RUN_LIVE)
        .select_related("project", "command", *OWNERS, "episode__environment__project")
        .select_related("attempt__training_job__project", "attempt__lifecycle_job__project")
        .select_related("revision__deployment__project", "session__project")
        .order_by("started_at", "command__created_at")
    )
    rows = []
    for member in members:
        owner, shown = _owner(member)
        rows.append(
            {
                "member": member,
                "owner": shown,
                "url": reverse(
                    f"admin:{owner._meta.app_label}_{owner._meta.model_name}_change",
                    args=[owner.pk],
                ),
                "project": member.project.slug if member.project else owner.project.slug,
                "cards": ", ".join(str(card["index"]) for card in member.cards) or "none",
                "since": member.started_at or member.command.created_at,
                "started": member.started_at is not None,
            }
        )
    return {"template": "admin/placement/node_members.html", "rows": rows}
