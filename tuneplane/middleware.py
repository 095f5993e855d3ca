import re

from django.conf import settings
from django.http import JsonResponse

from . import correlation
from .api.exceptions import error_body

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class CorrelationIdMiddleware:
    """Tie every audit event a request writes to one id, echoed as ``X-Request-ID``."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        offered = request.headers.get("X-Request-ID", "")
        token = correlation.begin(offered if _REQUEST_ID.match(offered) else None)
        try:
            response = self.get_response(request)
            response["X-Request-ID"] = correlation.current()
            return response
        finally:
            correlation.end(token)


def is_api_path(path: str) -> bool:
    return path == "/api" or path.startswith("/api/")


# Longer query strings are refused with our own error body, before an HTTP server's limit
# (gunicorn's request line: 4,094 bytes by default) answers with one of its own.
MAX_QUERY_STRING = 2048


class ApiRequestMiddleware:
    """API paths need no trailing slash; bodies over the limit and overlong query strings are
    refused unread; a NUL character in the path or a query parameter is refused by name (no
    database stores one, and PostgreSQL refuses to compare one)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if is_api_path(request.path_info):
            if len(request.path_info) > 1 and request.path_info.endswith("/"):
                request.path_info = request.path_info.rstrip("/") or "/"
            refusal = _refusal(request)
            if refusal is not None:
                return refusal
        return self.get_response(request)


def _refusal(request) -> JsonResponse | None:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > limit:
        return JsonResponse(
            error_body(
                "request_too_large",
                f"The request body is {length} bytes; the limit is {limit} bytes.",
            ),
            status=413,
        )
    query = request.META.get("QUERY_STRING", "")
    if len(query) > MAX_QUERY_STRING:
        return JsonResponse(
            error_body(
                "uri_too_long",
                f"The query string is {len(query)} characters; the limit is {MAX_QUERY_STRING}.",
            ),
            status=414,
        )
    if "\x00" in request.path_info:
        return JsonResponse(
            error_body("invalid", "The path contains a NUL character.", field="path"), status=400
        )
    for name, values in request.GET.lists():
        if "\x00" in name or any("\x00" in value for value in values):
            return JsonResponse(
                error_body(
                    "invalid",
                    f"Query parameter {name!r} contains a NUL character.",
                    field=name.replace("\x00", ""),
                ),
                status=400,
            )
    return None
