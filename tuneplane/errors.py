"""One error hierarchy, mapped once to HTTP (tuneplane.api.exceptions) and later to gRPC.

Messages name the field and the rule, and never name a Fleet the caller cannot see.
"""


class ApplicationError(Exception):
    status = 400
    code = "error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        field: str | None = None,
        rule: str | None = None,
        **details,
    ):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.field = field
        self.rule = rule
        self.details = details

    def as_body(self) -> dict:
        error = {"code": self.code, "message": self.message}
        if self.field is not None:
            error["field"] = self.field
        if self.rule is not None:
            error["rule"] = self.rule
        error.update(self.details)
        return {"error": error}


class ValidationFailed(ApplicationError):
    """Bad input: ``field`` says which, the message says why."""

    status = 400
    code = "invalid"


class NotFound(ApplicationError):
    status = 404
    code = "not_found"


class Conflict(ApplicationError):
    """The request is well-formed but a rule forbids it now; ``rule`` names the rule."""

    status = 409
    code = "conflict"


class PlacementRefused(ApplicationError):
    status = 422
    code = "placement_refused"

    def __init__(self, message: str, *, reason: str, **details):
        super().__init__(message, reason=reason, **details)
        self.reason = reason


class Unavailable(ApplicationError):
    """What is asked for is held elsewhere and cannot be reached now (a node not connected)."""

    status = 503
    code = "unavailable"
