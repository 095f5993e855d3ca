"""The body of a placement refusal, for the OpenAPI document: what P6 promises a submitter."""

from drf_spectacular.utils import OpenApiResponse, inline_serializer
from rest_framework import serializers

from tuneplane.api.schema import errors

from ..choices import Refusal

RefusalBody = inline_serializer(
    name="PlacementRefusal",
    fields={
        "error": inline_serializer(
            name="PlacementRefusalDetail",
            fields={
                "code": serializers.ChoiceField(choices=["placement_refused"]),
                "reason": serializers.ChoiceField(choices=Refusal.choices),
                "message": serializers.CharField(),
                "best_offer": serializers.CharField(
                    required=False,
                    help_text="With `inventory_fit`: the largest fit that does "
                    "exist among the Fleets you can see.",
                ),
                "candidates": serializers.ListField(
                    child=serializers.CharField(),
                    required=False,
                    help_text="With `fleet_not_named`: the serving Fleets you can see.",
                ),
            },
        )
    },
)


def refusals(*statuses: int) -> dict:
    """errors(), with a 422 that is a placement refusal."""
    responses = errors(*(status for status in statuses if status != 422))
    if 422 in statuses:
        responses[422] = OpenApiResponse(
            RefusalBody,
            description="Placement refused at admission; `reason` says which gate, at once (P6).",
        )
    return responses
