"""Q8: a playground session shows why it waits while it waits, and nothing once it is placed,
as a job and an episode do; each change of its reason is kept (issue 47: no test read a
session after its placement)."""

import pytest

from audit.services import Actor
from placement.models import Member
from placement.services import submission
from placement.services.allocator import allocate
from tests.conftest import SERVE
from tests.placement.test_quotas import submit
from tests.placement.test_running_rules import report


@pytest.fixture
def lab(node_fleet, gpu_node):
    gpu_node(node_fleet)
    return node_fleet


def shown(api, session) -> dict:
    response = api.get(f"/api/playground-sessions/{session.pk}")
    assert response.status_code == 200, response.content
    return response.json()


def test_Q8_a_session_placed_no_longer_shows_its_reason_to_wait(lab, member, member_api, gpu_node):
    submit(member, "ml", "first", cards=8)
    session = submission.playground_session_submit(
        actor=Actor.of_user(member), project="ml", name="try", cards=8, **SERVE
    )
    allocate(fleet_id=lab.id)
    waiting = shown(member_api, session)["waiting"]
    assert waiting is not None and waiting["reason"] == "priority"
    gpu_node(lab, address="10.0.0.2:1")  # a second machine joins
    allocate(fleet_id=lab.id)
    [process] = Member.objects.filter(session=session)
    placed = shown(member_api, session)
    assert placed["state"] == "live" and placed["waiting"] is None
    session.refresh_from_db()
    assert session.waiting is None  # the stored reason is cleared too, as a job's is
    assert [change["reason"] for change in placed["waiting_history"]] == ["priority"]  # kept
    report(process, ready=True)
    assert shown(member_api, session)["waiting"] is None
    # Its process ended and cleaned, the session not yet ended: it is not waiting again (the
    # pass never places a session twice: waiting.SESSION_WAITS).
    report(process, "failed", exit_code=1, reason="exit", cleaned=True)
    assert shown(member_api, session)["waiting"] is None
