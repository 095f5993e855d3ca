"""Projects and their members, as administrators read and write them through the API."""

from rest_framework import serializers

from ..models import Project
from .fields import StrictCharField, StrictSerializer

# PostgreSQL's integer, which the PositiveIntegerField is.
MAX_PRIORITY_CEILING = 2**31 - 1
OUTPUT_ONLY = ("members", "created_at")


class ProjectSerializer(serializers.ModelSerializer):
    members = serializers.SerializerMethodField(help_text="Usernames of the project's members.")

    class Meta:
        model = Project
        fields = ["slug", "name", "max_priority", "members", "created_at"]
        read_only_fields = fields

    def get_members(self, project) -> list[str]:
        # projects_with_members() prefetched them: no query per row.
        return [membership.user.get_username() for membership in project.memberships.all()]


class ProjectCreateSerializer(StrictSerializer):
    slug = StrictCharField(
        max_length=63, help_text="What workloads and API calls name the project by; fixed."
    )
    name = StrictCharField(max_length=200)
    max_priority = serializers.IntegerField(
        min_value=0,
        max_value=MAX_PRIORITY_CEILING,
        required=False,
        default=0,
        help_text="The highest priority the project's jobs may ask (Q3).",
    )

    read_only_names = OUTPUT_ONLY


class ProjectUpdateSerializer(StrictSerializer):
    """PATCH: the name and max_priority change; ``slug`` is read so that a request to change
    it is refused by name rather than ignored."""

    slug = StrictCharField(max_length=63, required=False)
    name = StrictCharField(max_length=200, required=False)
    max_priority = serializers.IntegerField(
        min_value=0, max_value=MAX_PRIORITY_CEILING, required=False
    )

    read_only_names = OUTPUT_ONLY


class MemberAddSerializer(StrictSerializer):
    username = StrictCharField(max_length=150)
