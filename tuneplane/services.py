from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import ProtectedError
from django.utils import timezone

from audit.services import Actor, audit_record

from .errors import Conflict, ValidationFailed
from .models import ApiToken, Membership, Project, new_secret


def api_token_create(
    *, actor: Actor, user: AbstractBaseUser, name: str = ""
) -> tuple[ApiToken, str]:
    """Make a token for ``user``; the plaintext is returned here and nowhere else."""
    made = new_secret(ApiToken.PREFIX)
    with transaction.atomic():
        token = ApiToken.objects.create(
            user=user, name=name, prefix=made.prefix, digest=made.digest
        )
        audit_record(
            actor=actor,
            action="api_token.created",
            target=token,
            after={"user": user.get_username(), "name": name, "prefix": token.prefix},
        )
    return token, made.secret


def api_token_revoke(*, actor: Actor, token: ApiToken) -> ApiToken:
    with transaction.atomic():
        token = ApiToken.objects.select_for_update().get(pk=token.pk)
        if token.revoked_at is None:
            token.revoked_at = timezone.now()
            token.save(update_fields=["revoked_at"])
            audit_record(
                actor=actor,
                action="api_token.revoked",
                target=token,
                before={"revoked_at": None},
                after={"revoked_at": token.revoked_at.isoformat()},
            )
    return token


def _clean(project: Project) -> None:
    """The model's own checks (slug shape, name length), as an error naming the field."""
    try:
        project.full_clean(validate_unique=False)
    except ValidationError as error:
        field, messages = next(iter(error.message_dict.items()))
        raise ValidationFailed(f"{field}: {' '.join(messages)}", field=field) from None


def project_create(*, actor: Actor, slug: str, name: str, max_priority: int = 0) -> Project:
    already = Conflict(
        f"A project with slug '{slug[:80]}' already exists.", code="already_exists", field="slug"
    )
    with transaction.atomic():
        project = Project(slug=slug, name=name, max_priority=max_priority)
        _clean(project)
        if Project.objects.filter(slug=slug).exists():
            raise already
        try:
            with transaction.atomic():
                project.save(force_insert=True)
        except IntegrityError:
            raise already from None
        audit_record(
            actor=actor,
            action="project.created",
            target=project,
            after={"slug": slug, "name": name, "max_priority": max_priority},
        )
    return project


def project_update(
    *, actor: Actor, project: Project, name: str | None = None, max_priority: int | None = None
) -> Project:
    """A project's slug is what workloads and API calls name: its name changes, and the
    highest priority its jobs may ask (Q3). One event for what changed; nothing, nothing."""
    with transaction.atomic():
        project = Project.objects.select_for_update().get(pk=project.pk)
        wanted = {"name": name, "max_priority": max_priority}
        changed = {
            field: value
            for field, value in wanted.items()
            if value is not None and getattr(project, field) != value
        }
        if changed:
            before = {field: getattr(project, field) for field in changed}
            for field, value in changed.items():
                setattr(project, field, value)
            _clean(project)
            project.save(update_fields=list(changed))
            audit_record(
                actor=actor,
                action="project.updated",
                target=project,
                before=before,
                after=changed,
            )
    return project


def membership_add(*, actor: Actor, project: Project, user: AbstractBaseUser) -> Membership:
    """``user`` becomes a member of ``project``: it sees the project's Fleets and submits to
    it (F8). Adding a member twice changes nothing."""
    with transaction.atomic():
        membership, created = Membership.objects.get_or_create(project=project, user=user)
        if created:
            audit_record(
                actor=actor,
                action="membership.added",
                target=membership,
                after={"project": project.slug, "user": user.get_username()},
            )
    return membership


def membership_remove(*, actor: Actor, membership: Membership) -> None:
    with transaction.atomic():
        membership = (
            Membership.objects.select_for_update()
            .select_related("project", "user")
            .filter(pk=membership.pk)
            .first()
        )
        if membership is None:
            return
        audit_record(
            actor=actor,
            action="membership.removed",
            target=membership,
            before={"project": membership.project.slug, "user": membership.user.get_username()},
        )
        membership.delete()


def project_delete(*, actor: Actor, project: Project) -> None:
    """A project no workload names; its memberships go with it, named in the event."""
    with transaction.atomic():
        project = Project.objects.select_for_update().filter(pk=project.pk).first()
        if project is None:
            return
        members = sorted(project.memberships.values_list("user__username", flat=True))
        audit_record(
            actor=actor,
            action="project.deleted",
            target=project,
            before={"slug": project.slug, "name": project.name, "members": members},
        )
        try:
            with transaction.atomic():
                project.delete()
        except ProtectedError:
            raise Conflict(
                f"Project '{project.slug}' still has workloads: it cannot be deleted."
            ) from None


def login_locked_out(*, username: str, client: str, count: int) -> None:
    """django-axes locked a username or a client address out of logging in. One event per
    (username, client) a window, carrying how many refused attempts it stands for: the
    attempts go on while locked out, and must not grow the audit table one row each."""
    user = get_user_model().objects.filter(**{get_user_model().USERNAME_FIELD: username}).first()
    with transaction.atomic():
        audit_record(
            actor=Actor.system("login"),
            action="login.locked_out",
            target=user if user is not None else ("auth.user", username[:150]),
            after={"username": username[:150], "client": client, "count": count},
        )
