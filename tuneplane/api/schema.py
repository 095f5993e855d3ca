"""The error body, once, for the OpenAPI document."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse, inline_serializer
from rest_framework import serializers


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """The API token as a security scheme on every operation: Swagger's Authorize takes a
    token from ``manage.py create_api_token`` (``make token``)."""

    target_class = "tuneplane.api.authentication.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token: `Authorization: Bearer <token>`.",
        }


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
    414: "Query string over the limit (2,048 characters). A request line over the HTTP "
    "server's own limit (gunicorn's, at most 8,190 bytes) never reaches the console: that "
    "server answers with its own page (text/html).",
    422: "Placement refused at admission; `reason` says why.",
    429: "Too many requests from this address; retry after the `Retry-After` seconds.",
    503: "The console's database did not answer (a restart, say); retry after the "
    "`Retry-After` seconds.",
}


def errors(*statuses: int) -> dict:
    return {
        status: OpenApiResponse(ErrorBody, description=_DESCRIPTIONS[status]) for status in statuses
    }


def document_request_refusals(result, generator, request, public):
    """Every API operation may refuse a request before its view runs: a malformed query or
    path (400) or an overlong query string (414), one with a body a body over the limit (413);
    and any may meet its database away (503). Said once here, not on every view."""
    for operation in (op for item in result.get("paths", {}).values() for op in item.values()):
        responses = operation.setdefault("responses", {})
        for status in (400, 414, 503, *((413,) if "requestBody" in operation else ())):
            responses.setdefault(
                str(status),
                {
                    "description": _DESCRIPTIONS[status],
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                    },
                },
            )
        responses["414"].setdefault("content", {})["text/html"] = {"schema": {"type": "string"}}
    return result
