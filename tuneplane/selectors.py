from django.contrib.auth import get_user_model
from django.db.models import Prefetch, QuerySet

from .errors import NotFound, ValidationFailed
from .models import Membership, Project


def project_by_slug(slug: str | None, *, field: str = "project") -> Project | None:
    if slug is None:
        return None
    project = Project.objects.filter(slug=slug).first()
    if project is None:
        raise ValidationFailed(f"{field}: no project '{slug[:80]}'.", field=field)
    return project


def projects_with_members() -> QuerySet[Project]:
    """Projects with their members' usernames fetched in one more query, not one per row."""
    return Project.objects.prefetch_related(
        Prefetch(
            "memberships",
            queryset=Membership.objects.select_related("user").order_by("user__username"),
        )
    )


def project_get(slug: str) -> Project:
    """The project a path names; a missing one is a 404 naming the slug."""
    project = projects_with_members().filter(slug=slug).first()
    if project is None:
        raise NotFound(f"No project '{slug[:80]}'.")
    return project


def user_by_username(username: str, *, field: str = "username"):
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise ValidationFailed(f"{field}: no user '{username[:150]}'.", field=field)
    return user


def membership_get(project: Project, username: str) -> Membership:
    membership = (
        Membership.objects.select_related("project", "user")
        .filter(project=project, user__username=username)
        .first()
    )
    if membership is None:
        raise NotFound(f"'{username[:150]}' is not a member of project '{project.slug}'.")
    return membership
