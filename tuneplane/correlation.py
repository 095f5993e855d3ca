"""The id that ties a request (or a task, or a stream) to the audit events it wrote."""

import contextvars
import uuid

_current: contextvars.ContextVar[str] = contextvars.ContextVar("correlation_id", default="")


def current() -> str:
    return _current.get()


def begin(correlation_id: str | None = None) -> contextvars.Token:
    return _current.set(correlation_id or uuid.uuid4().hex)


def end(token: contextvars.Token) -> None:
    _current.reset(token)
