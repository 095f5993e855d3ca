"""``manage.py project SLUG --name NAME [--member USER ...]``: make or update a project and add
members, the same services the API and the admin call (each audited). Run it twice, nothing
changes the second time."""

from django.core.management.base import BaseCommand, CommandError

from audit.services import Actor
from tuneplane import services
from tuneplane.errors import ApplicationError
from tuneplane.models import Project
from tuneplane.selectors import project_get, user_by_username

ACTOR = Actor.system("manage.py project")


class Command(BaseCommand):
    help = (
        "Make project SLUG (or rename it), set its max priority, and add members. "
        "Idempotent: prints what it changed."
    )

    def add_arguments(self, parser):
        parser.add_argument("slug", help="What workloads and API calls name the project by.")
        parser.add_argument("--name", help="Its display name (default: the slug, when made).")
        parser.add_argument(
            "--max-priority",
            type=int,
            help="The highest priority the project's jobs may ask (Q3).",
        )
        parser.add_argument(
            "--member",
            action="append",
            default=[],
            metavar="USERNAME",
            help="A user to add as a member; repeat for more. Members are never removed here.",
        )

    def handle(self, *args, slug, name, max_priority, member, **options):
        if max_priority is not None and max_priority < 0:
            raise CommandError("--max-priority: must be 0 or more.")
        try:
            users = [user_by_username(username, field="--member") for username in member]
            project = Project.objects.filter(slug=slug).first()
            if project is None:
                project = services.project_create(
                    actor=ACTOR, slug=slug, name=name or slug, max_priority=max_priority or 0
                )
                self.stdout.write(f"Project '{slug}' created (name: {project.name!r}).")
            else:
                before = {"name": project.name, "max_priority": project.max_priority}
                project = services.project_update(
                    actor=ACTOR, project=project, name=name, max_priority=max_priority
                )
                after = {"name": project.name, "max_priority": project.max_priority}
                changed = [
                    f"{key}: {before[key]!r} → {after[key]!r}"
                    for key in before
                    if before[key] != after[key]
                ]
                self.stdout.write(
                    f"Project '{slug}' updated ({'; '.join(changed)})."
                    if changed
                    else f"Project '{slug}' exists, unchanged."
                )
            already = set(project_get(slug).memberships.values_list("user__username", flat=True))
            for user in users:
                username = user.get_username()
                if username in already:
                    self.stdout.write(f"  {username}: already a member.")
                    continue
                services.membership_add(actor=ACTOR, project=project, user=user)
                already.add(username)
                self.stdout.write(f"  {username}: added as a member.")
        except ApplicationError as error:
            raise CommandError(error.message) from None
