import hashlib
import secrets
from dataclasses import dataclass

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

SLUG_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
slug_validator = RegexValidator(
    SLUG_PATTERN,
    "Use 1–63 lowercase letters, digits and hyphens, starting and ending with a letter or digit.",
)


class Project(models.Model):
    slug = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="projects"
    )
    # Q3: the highest priority the project's jobs may ask (an administrator's to raise).
    max_priority = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="membership_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project}"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class NewSecret:
    """A bearer secret (256 bits), the prefix an operator may see, and the hash we keep."""

    secret: str
    prefix: str
    digest: str


def new_secret(kind_prefix: str) -> NewSecret:
    secret = kind_prefix + secrets.token_urlsafe(32)
    return NewSecret(secret=secret, prefix=secret[:12], digest=hash_secret(secret))


class ApiToken(models.Model):
    """A bearer token for the API. Only its hash is stored; the token is shown once."""

    PREFIX = "tpa_"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, blank=True)
    # The first characters, so an operator can tell tokens apart without the secret.
    prefix = models.CharField(max_length=16)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"
