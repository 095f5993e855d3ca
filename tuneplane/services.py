from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from audit.services import audit_record

from .models import ApiToken, new_secret


def api_token_create(*, actor, user: AbstractBaseUser, name: str = "") -> tuple[ApiToken, str]:
    """Make a token for ``user``; the plaintext is returned here and nowhere else."""
    made = new_secret(ApiToken.PREFIX)
    with transaction.atomic():
        token = ApiToken.objects.create(user=user, name=name, prefix=made.prefix,
                                        digest=made.digest)
        audit_record(
            actor=actor,
            action="api_token.created",
            target=token,
            after={"user": user.get_username(), "name": name, "prefix": token.prefix},
        )
    return token, made.secret


def api_token_revoke(*, actor, token: ApiToken) -> ApiToken:
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
