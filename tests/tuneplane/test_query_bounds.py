"""R23: every query parameter is bounded. A whole number past PostgreSQL's bigint (2^63 − 1) —
``GET /api/training-jobs/5/logs?offset=9223372036854775808`` was a ``DataError`` and a 500
with Django's debug page — is a 400 naming the parameter, on every log and every list; the
bound itself is accepted. One parser (tuneplane.api.query) for all of them."""

import pytest
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from audit.services import Actor
from placement.services import submission
from tests.conftest import SERVE
from tests.placement.test_quotas import submit
from tuneplane.api.query import QUERY_INT_MAX, query_int
from tuneplane.errors import ValidationFailed

PAST = QUERY_INT_MAX + 1


def parsed(query: str, **options):
    return query_int(Request(APIRequestFactory().get(f"/x?{query}")), "offset", **options)


@pytest.mark.parametrize(
    "query, value",
    [("", 7), ("offset=0", 0), ("offset=1", 1), (f"offset={QUERY_INT_MAX}", QUERY_INT_MAX)],
)
def test_R23_a_whole_number_within_its_bounds_is_read(query, value):
    assert parsed(query, default=7) == value


@pytest.mark.parametrize("raw", [str(PAST), str(10**400), "-1", "1.5", "abc", "", "0x10"])
def test_R23_a_whole_number_out_of_its_bounds_is_refused_naming_it(raw):
    with pytest.raises(ValidationFailed) as refused:
        parsed(f"offset={raw}", default=0)
    assert refused.value.field == "offset" and "offset" in str(refused.value)


@pytest.fixture
def work(node_fleet, gpu_node, member, member_api):
    """A job, a deployment and an episode of ml's, none placed: their logs' parameters are
    read before anything else is asked of them."""
    gpu_node(node_fleet)
    job = submit(member, "ml", "job", cards=1)
    actor = Actor.of_user(member)
    deployment = submission.deployment_submit(
        actor=actor, project="ml", name="chat", **{**SERVE, "fleet": node_fleet.id}
    )
    fleet = node_fleet
    fleet.capabilities = ["train", "serve", "env"]
    fleet.save()
    environment = submission.environment_submit(
        actor=actor, project="ml", name="env", manifest={"fleet": fleet.id}
    )
    made = member_api.post(f"/api/environments/{environment.pk}/episodes", {"command": ["true"]})
    assert made.status_code in (200, 201), made.content
    return {
        f"/api/training-jobs/{job.pk}/logs": ("attempt", "rank", "tail_bytes", "offset"),
        f"/api/deployments/{deployment.pk}/logs": ("revision", "replica", "tail_bytes", "offset"),
        f"/api/environments/{environment.pk}/episodes/1/logs": ("tail_bytes", "offset"),
        "/api/fleets": ("offset",),
        "/api/training-jobs": ("offset",),
        "/api/deployments": ("offset",),
    }


def test_R23_every_logs_and_list_parameter_past_a_bigint_is_a_400_naming_it(work, member_api):
    for path, names in work.items():
        for name in names:
            answer = member_api.get(f"{path}?{name}={PAST}")
            assert answer.status_code == 400, (path, name, answer.content)
            assert name in answer.content.decode(), (path, name, answer.content)


def test_R23_the_bound_itself_is_no_error(work, member_api):
    """2^63 − 1 is read: a log's offset asks the member's node (here none is placed: 404),
    a list's is past its end (200, nothing)."""
    for path, names in work.items():
        for name in names:
            if name == "tail_bytes":
                continue  # bounded far lower, by the node protocol's frame (R15)
            answer = member_api.get(f"{path}?{name}={QUERY_INT_MAX}")
            assert answer.status_code in (200, 404), (path, name, answer.content)


@pytest.mark.parametrize("path", ["/api/audit", "/api/nodes"])
def test_R23_an_administrators_list_past_a_bigint_is_a_400_naming_offset(admin_api, path):
    answer = admin_api.get(f"{path}?offset={PAST}")
    assert answer.status_code == 400 and "offset" in answer.content.decode()
    assert admin_api.get(f"{path}?offset={QUERY_INT_MAX}").status_code == 200


def test_R23_a_path_number_past_a_bigint_is_not_found(work, member_api):
    answer = member_api.get(f"/api/training-jobs/{PAST}/logs")
    assert answer.status_code == 404
