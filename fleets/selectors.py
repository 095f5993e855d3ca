"""Shared reads. Visibility lives here and only here (F8)."""

from django.db.models import Exists, OuterRef, Q, QuerySet

from tuneplane.deployment_settings import ConfigWarning, unread_keys
from tuneplane.errors import NotFound
from tuneplane.models import Membership, Project
from tuneplane.permissions import is_admin

from .choices import FleetVisibility
from .models import Fleet


def fleets_visible_to(user) -> QuerySet[Fleet]:
    """Public Fleets, and the project Fleets of the caller's projects; admins see all."""
    fleets = Fleet.objects.select_related("project")
    if user is None or not user.is_authenticated:
        return fleets.none()
    if is_admin(user):
        return fleets
    own_projects = Membership.objects.filter(user=user).values("project_id")
    return fleets.filter(
        Q(visibility=FleetVisibility.PUBLIC)
        | Q(visibility=FleetVisibility.PROJECT, project_id__in=own_projects)
    )


def fleet_not_found(fleet_id: str) -> NotFound:
    """The one answer for a Fleet that is missing or invisible: they must read the same."""
    return NotFound(f"Fleet '{fleet_id}' not found.")


def fleet_get_visible(user, fleet_id: str) -> Fleet:
    fleet = fleets_visible_to(user).filter(pk=fleet_id).first()
    if fleet is None:
        raise fleet_not_found(fleet_id)
    return fleet


def _open_to(project) -> Q:
    """F8 in one place: a public Fleet, or a project Fleet of ``project`` (a project's id, or
    a reference to one in an outer query)."""
    return Q(visibility=FleetVisibility.PUBLIC) | Q(
        visibility=FleetVisibility.PROJECT, project_id=project
    )


def fleets_open_to(project) -> QuerySet[Fleet]:
    """F8: where a workload of ``project`` may go — public Fleets and that project's own.
    A project Fleet takes only its own project's workloads, whoever submits them: for any
    other project it does not exist, for a member of both projects and for staff alike."""
    return Fleet.objects.select_related("project").filter(_open_to(project.pk))


def projects_fleet_open_to(fleet_id: str, project_ids) -> set[int]:
    """R22: which of ``project_ids`` the Fleet is open to now, by F8's one rule: one query,
    however many projects — what the allocator asks of the work it is about to place."""
    open_here = Fleet.objects.filter(_open_to(OuterRef("pk")), pk=fleet_id)
    return set(
        Project.objects.filter(Exists(open_here), pk__in=project_ids).values_list("pk", flat=True)
    )


def fleet_get_open_to(project, fleet_id: str) -> Fleet:
    fleet = (
        fleets_open_to(project).filter(pk=fleet_id).first() if isinstance(fleet_id, str) else None
    )
    if fleet is None:
        raise fleet_not_found(fleet_id)
    return fleet


def fleet_config_warnings(fleet: Fleet) -> list[ConfigWarning]:
    """F4: config keys that no setting of this Fleet's kind reads."""
    return unread_keys(fleet.kind, fleet.config)
