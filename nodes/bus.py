"""What crosses gateway replicas: "node X has commands" and "close node X's stream".

A write anywhere (web, worker, another gateway) publishes a small event on one
Redis channel; every gateway replica hears it and acts if it holds that node's
stream. Pub/sub is a nudge, never the record: commands live in the database,
each replica also polls for pending ones, and a reconnecting node is reconciled
at Hello — so a lost event (Redis down, no Redis in the embedded default) only
delays delivery, it never loses a command.
"""

import json
import logging

import redis
from django.conf import settings
from django.db import transaction

logger = logging.getLogger("tuneplane.gateway")

CHANNEL = "tuneplane:node-control"
COMMANDS = "commands"
CLOSE = "close"


def _publish(event: dict) -> None:
    if not settings.REDIS_URL:
        return
    try:
        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2
        )
        with client:
            client.publish(CHANNEL, json.dumps(event))
    except redis.RedisError as error:
        logger.warning(
            "could not publish %s for node %s (%s); gateways will poll",
            event["type"],
            event["node"],
            error,
        )


def publish_on_commit(event_type: str, node_id: str, **details) -> None:
    """Publish once the writing transaction has committed, so a gateway reads the new rows."""
    event = {"type": event_type, "node": node_id, **details}
    transaction.on_commit(lambda: _publish(event))


def parse(data) -> dict | None:
    try:
        event = json.loads(data)
    except (TypeError, ValueError):
        return None
    if (
        not isinstance(event, dict)
        or event.get("type") not in (COMMANDS, CLOSE)
        or not isinstance(event.get("node"), str)
    ):
        return None
    return event
