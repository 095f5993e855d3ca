"""R15: every log endpoint is rate-limited per user — a tail is read from a node over its
control stream. The endpoints are read from the URL configuration, so a new one is held by
this test too (issue 47: removing the episode logs' throttle passed every test)."""

import pytest
from django.contrib.auth import get_user_model
from django.urls import URLPattern, URLResolver, get_resolver

from tests.conftest import Api


def log_routes(patterns=None, prefix="") -> list[str]:
    """Every route named ``…-logs``, its parameters filled with 999 (no such record)."""
    found = []
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            found += log_routes(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern) and (pattern.name or "").endswith("-logs"):
            for converter in ("<int:job_id>", "<int:deployment_id>", "<int:environment_id>"):
                route = route.replace(converter, "999")
            found.append("/" + route.replace("<int:number>", "1"))
    return found


def test_R15_the_log_endpoints_are_found():
    assert {
        "/api/training-jobs/999/logs",
        "/api/lifecycle-jobs/999/logs",
        "/api/deployments/999/logs",
        "/api/environments/999/episodes/1/logs",
    } <= set(log_routes())


@pytest.mark.parametrize("path", log_routes())
def test_R15_every_log_endpoint_is_rate_limited_per_user(path, db, settings):
    settings.TUNEPLANE_LOGS_RATE = "1/minute"
    users = get_user_model().objects
    reader, other = Api(users.create_user("reader")), Api(users.create_user("other"))
    assert reader.get(path).status_code == 404
    refused = reader.get(path)
    assert refused.status_code == 429 and int(refused["Retry-After"]) <= 60
    assert other.get(path).status_code == 404  # another user's budget is their own
