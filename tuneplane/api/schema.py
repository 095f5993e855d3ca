"""The error body, once, for the OpenAPI document."""

from drf_spectacular.utils import OpenApiResponse, inline_serializer
from rest_framework import serializers

ErrorBody = inline_serializer(
    name="Error",
    fields={
        "error": inline_serializer(
            name="ErrorDetail",
            fields={
                "code": serializers.CharField(),
                "message": serializers.CharField(),
                "field": serializers.CharField(required=False),
                "rule": serializers.CharField(required=False),
            },
        )
    },
)

_DESCRIPTIONS = {
    400: "Bad input: `field` names which, `message` says why. Nothing was changed.",
    401: "No or invalid credentials.",
    403: "Authenticated, but not allowed (administrators only).",
    404: "Not found — also the answer for anything the caller may not see.",
    409: "Conflicts with a rule; `rule` names it.",
    413: "Request body over the limit.",
    422: "Placement refused at admission; `reason` says why.",
}


def errors(*statuses: int) -> dict:
    return {status: OpenApiResponse(ErrorBody, description=_DESCRIPTIONS[status])
            for status in statuses}
