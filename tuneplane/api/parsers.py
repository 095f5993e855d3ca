"""JSON bodies with a bounded depth.

Python's JSON decoder recurses once per level: a body of a few thousand ``[`` ran out of
stack (RecursionError, a 500) before any view or serializer ran, unauthenticated. No body
the API takes nests anywhere near MAX_DEPTH; a deeper one is a 400 naming the body.
"""

from rest_framework.parsers import JSONParser

from tuneplane.errors import ValidationFailed

MAX_DEPTH = 32


def _too_deep(value, limit: int) -> bool:
    """Whether ``value`` nests past ``limit``; a walk with its own stack, not recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend(
                (child, depth + 1) for child in children if isinstance(child, (dict, list))
            )
    return False


def _refusal() -> ValidationFailed:
    return ValidationFailed(
        f"body: JSON nested deeper than {MAX_DEPTH} levels is refused.", field="body"
    )


class DepthLimitedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise _refusal() from None
        if _too_deep(data, MAX_DEPTH):
            raise _refusal()
        return data
