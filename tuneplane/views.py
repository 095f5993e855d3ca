import logging

from django.db import connection
from django.http import JsonResponse
from django.views.defaults import page_not_found, server_error

from .api.exceptions import error_body
from .middleware import is_api_path

logger = logging.getLogger("tuneplane")


def healthz(request):
    """Liveness for a load balancer: the process answers and the database does."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # any database failure is "not healthy", said plainly
        # Which dependency is down, never the driver's text (hosts, users, paths): the
        # server's log has that, for operators.
        logger.warning("healthz: database unavailable: %s", exc)
        return JsonResponse({"status": "unhealthy", "database": "unavailable"}, status=503)
    return JsonResponse({"status": "ok", "database": "ok"})


def not_found(request, exception=None):
    if is_api_path(request.path_info):
        return JsonResponse(
            error_body("not_found", f"No API path {request.path_info}."), status=404
        )
    return page_not_found(request, exception)


def internal_error(request):
    if is_api_path(request.path_info):
        return JsonResponse(
            error_body("server_error", "Internal error; the request id is in X-Request-ID."),
            status=500,
        )
    return server_error(request)
