from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from tuneplane.api.fields import StrictCharField, StrictChoiceField, StrictSerializer

from ..choices import CommandKind
from ..models import JoinToken, Node, NodeCommand
from ..services.commands import payload_shown
from ..telemetry_shown import telemetry_shown


class JoinTokenSerializer(serializers.ModelSerializer):
    """A token as listed later: never the secret or the commands that carry it."""

    fleet = serializers.CharField(source="fleet_id", read_only=True)
    node = serializers.CharField(source="node_id", read_only=True, allow_null=True)
    created_by = serializers.CharField(
        source="created_by.username", read_only=True, allow_null=True, default=None
    )

    class Meta:
        model = JoinToken
        fields = [
            "id",
            "fleet",
            "prefix",
            "created_by",
            "created_at",
            "expires_at",
            "used_at",
            "node",
            "revoked_at",
        ]
        read_only_fields = fields


class MintedJoinTokenSerializer(serializers.Serializer):
    """The mint response, the only place the token is ever shown (J2)."""

    id = serializers.IntegerField()
    fleet = serializers.CharField()
    token = serializers.CharField()
    expires_at = serializers.DateTimeField()
    install_command = serializers.CharField()
    join_command = serializers.CharField()


class InventorySerializer(serializers.Serializer):
    cards = serializers.ListField(child=serializers.DictField(), required=False)
    driver = serializers.CharField(required=False, allow_null=True)
    container_runtime = serializers.CharField(required=False, allow_null=True)
    storage_root_visible = serializers.BooleanField(required=False)
    cpu_budget = serializers.IntegerField(required=False, allow_null=True)
    memory_budget_bytes = serializers.IntegerField(required=False, allow_null=True)


class JoinRequestSerializer(StrictSerializer):
    fleet = StrictCharField(max_length=63)
    token = StrictCharField(max_length=200)
    csr = StrictCharField(max_length=16384, trim_whitespace=False)
    address = StrictCharField(max_length=300, required=False, allow_blank=True, default="")
    hostname = StrictCharField(max_length=253, required=False, allow_blank=True, default="")
    fingerprint = StrictCharField(max_length=64, required=False, allow_blank=True, default="")
    agent_version = StrictCharField(max_length=64, required=False, allow_blank=True, default="")
    # Checked by the service (nodes.inventory), which names the exact field at fault.
    inventory = serializers.JSONField()

    class Meta:
        ref_name = "JoinRequest"


class JoinWarningSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()


class JoinResponseSerializer(serializers.Serializer):
    node_id = serializers.CharField()
    fleet = serializers.CharField()
    certificate = serializers.CharField()
    ca_bundle = serializers.CharField()
    credential_expires_at = serializers.DateTimeField()
    gateway_target = serializers.CharField()
    warnings = JoinWarningSerializer(many=True)


class NodeSerializer(serializers.ModelSerializer):
    """The three things the Fleet page shows apart: connection, scheduling, inventory (L7)."""

    fleet = serializers.CharField(
        source="fleet_id",
        allow_null=True,
        help_text="null once a removed node's Fleet is deleted (F7)",
    )
    former_fleet = serializers.CharField(
        help_text="The deleted Fleet a removed node belonged to; empty while it has one."
    )
    connection = serializers.SerializerMethodField()
    scheduling = serializers.SerializerMethodField()
    inventory = serializers.SerializerMethodField()
    liveness = serializers.SerializerMethodField()
    address_shared = serializers.SerializerMethodField()
    telemetry = serializers.SerializerMethodField(
        help_text="The latest telemetry sample with its observation time, each card with its "
        "health; stale: no sample for the refresh period (20 telemetry intervals) and two "
        "intervals more (the last values, not zeros); "
        "null: none ever sent."
    )

    class Meta:
        model = Node
        fields = [
            "id",
            "fleet",
            "former_fleet",
            "address",
            "hostname",
            "connection",
            "scheduling",
            "inventory",
            "liveness",
            "address_shared",
            "telemetry",
            "agent_version",
            "created_at",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.DictField())
    def get_connection(self, node):
        """``last_heard_at`` outlives the stream: when a disconnected node was last heard,
        and how its last session ended."""
        session = self.context.get("live_sessions", {}).get(node.id)
        heard = {
            "last_heard_at": node.last_seen_at,
            "last_session_closed_at": node.last_session_closed_at,
            "last_session_close_reason": node.last_session_close_reason or None,
        }
        if session is None:
            return {"state": "disconnected", "session": None, "last_heartbeat_at": None, **heard}
        return {
            "state": "connected",
            "session": str(session.id),
            "last_heartbeat_at": session.last_heartbeat_at,
            "gateway": session.gateway,
            **heard,
        }

    @extend_schema_field(serializers.DictField())
    def get_scheduling(self, node):
        cordons = [
            {"source": c.source, "reason": c.reason, "at": c.created_at, "by": c.created_by}
            for c in node.cordons.all()
        ]
        shown = {"state": node.scheduling_shown(cordons), "cordons": cordons, "drain": None}
        if node.drain_started_at is not None:
            left = self.context.get("work_left", {}).get(node.id, {})
            shown["drain"] = {
                "reason": node.drain_reason,
                "by": node.drain_by,
                "at": node.drain_started_at,
                "deadline": node.drain_deadline,
                "overdue": node.drain_overdue_at is not None,
                "overdue_since": node.drain_overdue_at,
                "work_left": {kind: len(ids) for kind, ids in left.items()},
            }
        return shown

    @extend_schema_field(serializers.DictField())
    def get_inventory(self, node):
        series = self.context.get("card_series", {})
        inventory = node.inventory
        return {
            "cards": [
                {**card, "series": series.get(card["name"])} for card in inventory.get("cards", [])
            ],
            "driver": inventory.get("driver"),
            "container_runtime": inventory.get("container_runtime"),
            "storage_root_visible": inventory.get("storage_root_visible"),
            "cpu_budget": inventory.get("cpu_budget"),
            "memory_budget_bytes": inventory.get("memory_budget_bytes"),
            "observed_at": node.inventory_observed_at,
        }

    @extend_schema_field(serializers.DictField())
    def get_liveness(self, node):
        return node.liveness()

    @extend_schema_field(serializers.DictField(allow_null=True))
    def get_telemetry(self, node):
        row = self.context.get("telemetry", {}).get(node.id)
        return telemetry_shown(node, row, self.context.get("now") or timezone.now())

    def get_address_shared(self, node) -> bool:
        return node.address in self.context.get("shared_addresses", set())


class CordonRequestSerializer(StrictSerializer):
    reason = StrictCharField(max_length=200)

    class Meta:
        ref_name = "CordonRequest"


class DrainRequestSerializer(StrictSerializer):
    reason = StrictCharField(max_length=200)
    deadline = serializers.DateTimeField(
        required=False,
        allow_null=True,
        default=None,
        help_text="When the machine should be idle. Nothing is stopped at it (D1): past it "
        "the drain shows overdue, with what still runs.",
    )

    class Meta:
        ref_name = "DrainRequest"


class FleetDrainResultSerializer(serializers.Serializer):
    fleet = serializers.CharField()
    nodes = NodeSerializer(many=True)


class CommandRequestSerializer(StrictSerializer):
    kind = StrictChoiceField(choices=CommandKind.values)
    # Checked by the service, which names the exact field at fault.
    payload = serializers.JSONField()

    class Meta:
        ref_name = "CommandRequest"


class CommandSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node_id")
    payload = serializers.SerializerMethodField(
        help_text="A member's env by name only: its values are its job's secrets."
    )

    @extend_schema_field(serializers.DictField())
    def get_payload(self, command) -> dict:
        return payload_shown(command)

    class Meta:
        model = NodeCommand
        fields = [
            "id",
            "node",
            "kind",
            "payload",
            "state",
            "exit_code",
            "created_by",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields
