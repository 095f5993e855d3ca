"""Query parameters read one way by every view.

A boolean is read with DRF's ``BooleanField`` values (``1``, ``true``, ``True``, ``yes``, ``on``
… and ``0``, ``false``, ``no``, ``off`` …), as a request body's booleans are; anything else is a
400 naming the parameter, never quietly false: ``?dry_run=True`` read as false wrote a
submission its user meant as a dry run (Q7).

A whole number is always bounded (R23): at most ``QUERY_INT_MAX`` — PostgreSQL's ``bigint``
and the node protocol's ``int64`` — and at least its own least; outside, or not a whole
number, a 400 naming the parameter. ``?offset=9223372036854775808`` on a log was a
``DataError`` and a 500."""

from rest_framework import serializers
from rest_framework.fields import BooleanField

from tuneplane.errors import ValidationFailed

QUERY_INT_MAX = (1 << 63) - 1


def query_integer(*, min_value: int = 0, max_value: int = QUERY_INT_MAX, **options):
    """An integer query parameter of a query serializer, bounded on both sides (R23)."""
    return serializers.IntegerField(
        min_value=min_value, max_value=min(max_value, QUERY_INT_MAX), **options
    )


def query_int(request, name: str, *, default: int, min_value: int = 0) -> int:
    """``?name=…`` as a bounded whole number (query_integer's bounds); absent, ``default``."""
    value = request.query_params.get(name)
    if value is None:
        return default
    try:
        return query_integer(min_value=min_value).run_validation(value)
    except serializers.ValidationError as refused:
        raise ValidationFailed(f"{name}: {refused.detail[0]}", field=name) from None


def query_flag(request, name: str) -> bool:
    """``?name=…`` as a boolean; absent, false."""
    value = request.query_params.get(name)
    if value is None:
        return False
    if value.lower() in BooleanField.TRUE_VALUES:  # DRF's values, in any case, as DRF reads them
        return True
    if value.lower() in BooleanField.FALSE_VALUES:
        return False
    raise ValidationFailed(
        f"{name} must be a boolean (true or false, 1 or 0, yes or no); got '{value[:40]}'.",
        field=name,
    )
