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


class ApiRequestMiddleware:
    """API paths need no trailing slash, and bodies over the limit are refused unread."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if is_api_path(request.path_info):
            if len(request.path_info) > 1 and request.path_info.endswith("/"):
                request.path_info = request.path_info.rstrip("/") or "/"
            limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0
            if length > limit:
                return JsonResponse(
                    error_body("request_too_large",
                               f"The request body is {length} bytes; the limit is {limit} bytes."),
                    status=413,
                )
        return self.get_response(request)
