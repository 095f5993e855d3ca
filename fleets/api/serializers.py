from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from tuneplane.api.fields import StrictCharField, StrictChoiceField, StrictSerializer
from tuneplane.permissions import is_admin

from ..choices import FleetCapability, FleetDelivery, FleetKind, FleetState, FleetVisibility
from ..models import Fleet
from ..selectors import fleet_config_warnings

OUTPUT_ONLY = ("created_at", "updated_at", "warnings")


class FleetSerializer(serializers.ModelSerializer):
    """A Fleet as its reader may see it: ``config`` (cluster endpoints, where secrets come
    from) is an administrator's to read; members get the Fleet without it. Without a
    ``viewer`` in the context, nobody is assumed to be an administrator."""

    project = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    capabilities = serializers.ListField(child=serializers.ChoiceField(FleetCapability.choices))
    config = serializers.DictField(required=False, help_text="Shown to administrators only.")

    class Meta:
        model = Fleet
        fields = [
            "id",
            "kind",
            "delivery",
            "capabilities",
            "visibility",
            "project",
            "state",
            "config",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def to_representation(self, fleet):
        shown = super().to_representation(fleet)
        if not is_admin(self.context.get("viewer")):
            del shown["config"]
        return shown


class WarningSerializer(serializers.Serializer):
    code = serializers.CharField()
    key = serializers.CharField()
    message = serializers.CharField()


class FleetWriteResultSerializer(FleetSerializer):
    """A write answers with the Fleet and what its config does not do (F4)."""

    warnings = serializers.SerializerMethodField()

    class Meta(FleetSerializer.Meta):
        fields = FleetSerializer.Meta.fields + ["warnings"]
        read_only_fields = fields

    @extend_schema_field(WarningSerializer(many=True))
    def get_warnings(self, fleet):
        return [w.as_dict() for w in fleet_config_warnings(fleet)]


class _FleetFields(StrictSerializer):
    capabilities = serializers.ListField(
        child=StrictChoiceField(FleetCapability.choices), max_length=len(FleetCapability.values) * 2
    )
    visibility = StrictChoiceField(FleetVisibility.choices)
    project = StrictCharField(max_length=63, allow_null=True)
    state = StrictChoiceField(FleetState.choices)
    config = serializers.DictField()


class FleetCreateSerializer(_FleetFields):
    id = StrictCharField(max_length=63)
    kind = StrictChoiceField(FleetKind.choices)
    delivery = StrictChoiceField(
        FleetDelivery.choices, required=False, help_text="Follows the kind unless given (F2)."
    )

    read_only_names = OUTPUT_ONLY

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in ("capabilities", "visibility", "project", "state", "config"):
            self.fields[name].required = False


class FleetUpdateSerializer(_FleetFields):
    """PATCH: what may change. ``id``, ``kind`` and ``delivery`` are read so that a
    request to change them is refused by name (F1) rather than ignored."""

    id = StrictCharField(max_length=63, required=False)
    kind = StrictChoiceField(FleetKind.choices, required=False)
    delivery = StrictChoiceField(FleetDelivery.choices, required=False)

    read_only_names = OUTPUT_ONLY

    def __init__(self, *args, **kwargs):
        kwargs["partial"] = True
        super().__init__(*args, **kwargs)
