"""Every API error has one body: ``{"error": {"code": ..., "message": ...}}``."""

import logging

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db import InterfaceError, OperationalError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from tuneplane.errors import ApplicationError

logger = logging.getLogger("tuneplane.api")
# Seconds a client is asked to wait when the database is away (a restart takes a few).
DATABASE_RETRY_AFTER = 5


def error_body(code: str, message: str, **details) -> dict:
    return {"error": {"code": code, "message": message, **details}}


def _flatten(detail, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested validation detail as ``{"field.sub": ["message", ...]}``."""
    if isinstance(detail, dict):
        flat = {}
        for key, value in detail.items():
            if isinstance(key, int):  # a list item's errors, keyed by its index
                path = f"{prefix}[{key}]"
            elif key == "non_field_errors":
                path = prefix
            else:
                path = f"{prefix}.{key}" if prefix else str(key)
            flat.update(_flatten(value, path))
        return flat
    if isinstance(detail, list):
        if all(not isinstance(item, (dict, list)) for item in detail):
            return {prefix or "body": [str(item) for item in detail]}
        flat = {}
        for index, item in enumerate(detail):
            flat.update(_flatten(item, f"{prefix}[{index}]" if prefix else f"[{index}]"))
        return flat
    return {prefix or "body": [str(detail)]}


def validation_body(detail) -> dict:
    fields = _flatten(detail)
    field, messages = next(iter(fields.items()))
    message = messages[0] if field == "body" else f"{field}: {messages[0]}"
    return error_body("invalid", message, field=field, fields=fields)


def exception_handler(exc, context):
    if isinstance(exc, ApplicationError):
        return Response(exc.as_body(), status=exc.status)
    if isinstance(exc, (OperationalError, InterfaceError)):
        # The database restarting, unreachable, or a deadlock it broke: the request's
        # transaction was rolled back, and the next connection is a new one. A client is
        # told to retry, in the API's own error body, not handed a 500 page.
        logger.warning(
            "database unavailable for %s: %s",
            context["request"].path,
            str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
        )
        return Response(
            error_body(
                "database_unavailable",
                "The console's database did not answer, so the request "
                "may not have completed; read before repeating a write. Retry in "
                f"{DATABASE_RETRY_AFTER} seconds.",
            ),
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(DATABASE_RETRY_AFTER)},
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        response.data = validation_body(exc.detail)
        response.status_code = status.HTTP_400_BAD_REQUEST
    else:
        code = exc.get_codes() if isinstance(exc.get_codes(), str) else "error"
        response.data = error_body(code, str(exc.detail))
    return response
