"""H6, H7 over the API: what a Fleet's health breaker shows — its state, its limit, the
recent card faults (quarantined or, tripped, recorded only). The views are in views.py."""

from rest_framework import serializers


class CardFaultSerializer(serializers.Serializer):
    node = serializers.CharField(source="node_id")
    index = serializers.IntegerField()
    uuid = serializers.CharField()
    reason = serializers.CharField()
    at = serializers.DateTimeField()
    quarantined = serializers.BooleanField(
        help_text="False: recorded only, the Fleet's health breaker tripped (H7)."
    )


class HealthBreakerSerializer(serializers.Serializer):
    fleet = serializers.CharField()
    tripped = serializers.BooleanField()
    tripped_at = serializers.DateTimeField(allow_null=True)
    tripped_reason = serializers.CharField()
    reset_at = serializers.DateTimeField(allow_null=True)
    share = serializers.FloatField(help_text="TUNEPLANE_HEALTH_BREAKER_SHARE")
    window_seconds = serializers.IntegerField(help_text="TUNEPLANE_HEALTH_BREAKER_WINDOW")
    cards = serializers.IntegerField(help_text="The Fleet's cards, quarantined or not.")
    limit = serializers.IntegerField(help_text="Automatic quarantines allowed in one window.")
    quarantined_in_window = serializers.IntegerField()
    faults = CardFaultSerializer(many=True, help_text="The latest card faults, newest first.")
