"""A record's history (issue 39, placement.history and ``.../events``): the audit events of a
job and of its attempts and members, oldest first, each with what changed and why; the same
for a deployment and its revisions and replicas, a playground session, an episode. Who may
not see the record is answered not found, exactly as for a record that does not exist (F8);
the queries do not grow with the events."""

import pytest

from audit.services import Actor
from nodes.services.commands import Reported, node_command_report
from placement.models import Member
from placement.services import episodes, serving, submission
from placement.services.allocator import allocate
from tests.conftest import SERVE

pytestmark = pytest.mark.django_db


@pytest.fixture
def lab(make_fleet, gpu_node):
    fleet = make_fleet("lab", capabilities=["train", "serve", "env"])
    gpu_node(fleet)
    return fleet


def exited(member: Member, code: int) -> None:
    for state, exit_code in (("running", None), ("failed", code)):
        node_command_report(
            node_id=member.node_id,
            reported=Reported(member.command_id, state, exit_code, "exit" if exit_code else ""),
        )


def events_of(api, path):
    response = api.get(f"{path}/events")
    assert response.status_code == 200, response.content
    return response.json()["results"]


def test_a_jobs_history_is_its_events_and_its_attempts_and_members_oldest_first(
    lab, member, member_api
):
    job = submission.training_job_submit(
        actor=Actor.of_user(member), project="ml", name="train", cards=2, script="exit 3"
    )
    allocate(fleet_id=lab.id)
    [one] = Member.objects.filter(attempt__training_job=job)
    exited(one, 3)
    events = events_of(member_api, f"/api/training-jobs/{job.pk}")
    targets = {event["target"]["type"] for event in events}
    assert {"placement.trainingjob", "placement.attempt", "placement.member"} <= targets
    assert events[0]["action"] == "trainingjob.admitted"
    assert events[0]["after"]["fleet"] == "lab" and events[0]["actor"]["label"] == "mia"
    assert [e["at"] for e in events] == sorted(e["at"] for e in events)
    failed = [
        e for e in events if e["target"]["type"] == "placement.member" and "failed" in e["action"]
    ]
    assert failed and failed[-1]["reason"] == "exit" and failed[-1]["after"]["state"] == "failed"
    assert events[-1]["target"] == {"type": "placement.trainingjob", "id": str(job.pk)}
    # Another job's events are not in it.
    other = submission.training_job_submit(
        actor=Actor.of_user(member), project="ml", name="other", cards=1, script="true"
    )
    shown = events_of(member_api, f"/api/training-jobs/{job.pk}")
    assert {"type": "placement.trainingjob", "id": str(other.pk)} not in [
        e["target"] for e in shown
    ]
    assert len(shown) == len(events)


def test_F8_history_of_a_record_the_caller_cannot_see_is_not_found_as_a_missing_one(
    lab, member, outsider_api, admin_api
):
    job = submission.training_job_submit(
        actor=Actor.of_user(member), project="ml", name="train", cards=1, script="true"
    )
    hidden = outsider_api.get(f"/api/training-jobs/{job.pk}/events")
    missing = outsider_api.get("/api/training-jobs/99999/events")
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["error"]["message"].replace(str(job.pk), "N") == missing.json()["error"][
        "message"
    ].replace("99999", "N")
    assert admin_api.get(f"/api/training-jobs/{job.pk}/events").status_code == 200
    # Each kind answers for itself: a training job's id is no lifecycle job's.
    assert outsider_api.get(f"/api/lifecycle-jobs/{job.pk}/events").status_code == 404


def test_a_deployments_session_and_episodes_history(lab, member, member_api, outsider_api):
    actor = Actor.of_user(member)
    deployment = submission.deployment_submit(
        actor=actor, project="ml", name="chat", fleet="lab", **SERVE
    )
    session = submission.playground_session_submit(
        actor=actor, project="ml", name="try", **{**SERVE, "port": 9000}
    )
    environment = submission.environment_submit(
        actor=actor, project="ml", name="gym", manifest={"fleet": "lab", "command": ["true"]}
    )
    episode = episodes.episode_start(actor=actor, environment=environment)
    allocate(fleet_id=lab.id)
    shown = events_of(member_api, f"/api/deployments/{deployment.pk}")
    assert shown[0]["action"] == "deployment.admitted"
    assert "placement.member" in {e["target"]["type"] for e in shown}  # its replica placed
    revision = serving.revision_create(actor=actor, deployment=deployment, port=8001)
    rolled = events_of(member_api, f"/api/deployments/{deployment.pk}")
    assert {"type": "placement.revision", "id": str(revision.pk)} in [e["target"] for e in rolled]
    assert events_of(member_api, f"/api/playground-sessions/{session.pk}")[0]["action"] == (
        "playgroundsession.admitted"
    )
    path = f"/api/environments/{environment.pk}/episodes/{episode.number}"
    assert {e["target"]["type"] for e in events_of(member_api, path)} >= {"placement.episode"}
    for hidden in (
        f"/api/deployments/{deployment.pk}",
        f"/api/playground-sessions/{session.pk}",
        path,
    ):
        assert outsider_api.get(f"{hidden}/events").status_code == 404
    assert (
        member_api.get(f"/api/environments/{environment.pk}/episodes/99/events").status_code == 404
    )


def test_a_history_takes_a_fixed_number_of_queries(
    lab, member, member_api, django_assert_max_num_queries
):
    job = submission.training_job_submit(
        actor=Actor.of_user(member), project="ml", name="train", cards=2, script="exit 1"
    )
    with django_assert_max_num_queries(8) as few:
        assert len(events_of(member_api, f"/api/training-jobs/{job.pk}")) == 1
    allocate(fleet_id=lab.id)  # an attempt, its member, and their moves
    [one] = Member.objects.filter(attempt__training_job=job)
    exited(one, 1)
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert len(events_of(member_api, f"/api/training-jobs/{job.pk}")) > 4
