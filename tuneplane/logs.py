"""Log lines stay one line each: values from requests and node messages (a Fleet id, a
hostname, a reason) may carry a newline or a terminal escape, which would forge an entry."""

import logging
import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escape(text: str) -> str:
    return _CONTROL.sub(lambda match: repr(match.group())[1:-1], text)


class OneLineFormatter(logging.Formatter):
    """The message escaped; a traceback, which Django and Celery add, keeps its lines."""

    def formatMessage(self, record):
        record.message = escape(record.message)
        return super().formatMessage(record)
