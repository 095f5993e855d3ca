from rest_framework import serializers

from ..models import AuditEvent


class AuditEventSerializer(serializers.ModelSerializer):
    actor = serializers.SerializerMethodField()
    target = serializers.SerializerMethodField()

    class Meta:
        model = AuditEvent
        fields = [
            "id",
            "at",
            "actor",
            "action",
            "target",
            "before",
            "after",
            "forced",
            "correlation_id",
        ]
        read_only_fields = fields

    def get_actor(self, event) -> dict:
        return {"type": event.actor_type, "id": event.actor_id, "label": event.actor_label}

    def get_target(self, event) -> dict:
        return {"type": event.target_type, "id": event.target_id}
