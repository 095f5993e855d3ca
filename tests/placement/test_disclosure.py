"""R23: what a member of one project reads about preemption and waiting names another
project's work only as "another project's work" — a victim's preemption record (its ``by``
and ``why``), a preemptor's wait (its victims and message), a dry run's ``preempts`` and a
record's history; administrators, and members of both projects, read every name. The review
read ``"why": "project projb waits…"`` on its own job, and another project's job in a dry
run's ``preempts``."""

import json

import pytest

from placement import disclosure as shown
from placement.disclosure import ANOTHER
from placement.models import TrainingJob
from placement.services.allocator import allocate
from tests.conftest import Api
from tests.placement.test_preempting import borrowed_job_running
from tests.placement.test_quotas import submit
from tuneplane.models import Membership, Project

# --- Without a database. ---

OWN, OTHER = 1, 2


def sees_own(project) -> bool:
    return project == OWN


def everyone(project) -> bool:
    return True


VICTIMS = [
    {"job": "trainingjob-3", "deadline": "2026-01-01T00:02:00", "project": OWN},
    {"job": "trainingjob-4", "deadline": "2026-01-01T00:01:00", "project": OTHER},
    {"job": "trainingjob-5", "deadline": "2026-01-01T00:00:00"},  # preempted before R23
]


def test_R23_victims_of_other_projects_are_another_projects_work():
    assert shown.victims_shown([], sees_own) == []
    assert [v["job"] for v in shown.victims_shown(VICTIMS, sees_own)] == [
        "trainingjob-3",
        ANOTHER,
        ANOTHER,  # whose is not recorded: an administrator's to read
    ]
    assert [v["job"] for v in shown.victims_shown(VICTIMS, everyone)] == [
        "trainingjob-3",
        "trainingjob-4",
        "trainingjob-5",
    ]
    for victim in shown.victims_shown(VICTIMS, everyone):
        assert "project" not in victim and victim["deadline"]


def test_R23_a_preemptor_of_another_project_is_another_projects_work():
    record = {
        "by": "trainingjob-7",
        "by_project": OTHER,
        "why": "project projb waits for cards within its guarantee; this job ran on "
        "borrowed cards (rule Q5)",
        "at": "2026-01-01T00:00:00",
        "deadline": "2026-01-01T00:02:00",
    }
    hidden = shown.preemption_shown(record, sees_own)
    assert hidden["by"] == ANOTHER and "projb" not in json.dumps(hidden)
    assert hidden["why"].startswith(ANOTHER) and "rule Q5" in hidden["why"]
    assert (hidden["at"], hidden["deadline"]) == (record["at"], record["deadline"])
    assert shown.preemption_shown(record, everyone) == {
        k: v for k, v in record.items() if k != "by_project"
    }
    own = {**record, "by_project": OWN, "why": "a job of its project with priority 5 waits"}
    assert shown.preemption_shown(own, sees_own)["by"] == "trainingjob-7"
    legacy = {k: v for k, v in record.items() if k != "by_project"}
    assert shown.preemption_shown(legacy, sees_own)["by"] == ANOTHER
    assert shown.preemption_shown(None, sees_own) is None


def test_R23_a_preempting_wait_names_other_projects_victims_as_another_projects_work():
    wait = {
        "reason": "preempting",
        "message": "preempting 2 job(s) for its cards: trainingjob-3, trainingjob-4; …",
        "numbers": {"victims": VICTIMS[:2]},
        "position_in_project": 1,
        "position_in_fleet": 1,
        "since": "2026-01-01T00:00:00",
    }
    hidden = shown.wait_shown(wait, sees_own)
    assert "trainingjob-4" not in json.dumps(hidden)
    assert hidden["message"] == (
        f"preempting 2 job(s) for its cards: trainingjob-3, {ANOTHER}; stopped by "
        "2026-01-01T00:02:00 at the latest"
    )
    assert hidden["position_in_fleet"] == 1 and hidden["since"] == wait["since"]
    capacity = {"reason": "capacity", "message": "needs 8 cards; 3 free", "numbers": {}}
    assert shown.wait_shown(capacity, sees_own) is capacity
    assert shown.wait_shown(None, sees_own) is None


def test_R23_a_history_event_of_preemption_is_shown_as_the_record_is():
    after = {"preemptor": "trainingjob-9", "victims": VICTIMS[1:2]}
    assert shown.event_shown("trainingjob.preempts", after, sees_own)["victims"][0]["job"] == (
        ANOTHER
    )
    victim = {"state": "preempting", "preemption": {"by": "x", "by_project": OTHER, "why": ""}}
    assert shown.event_shown("trainingjob.preempting", victim, sees_own)["preemption"]["by"] == (
        ANOTHER
    )
    other = {"state": "queued", "reason": "preempted"}
    assert shown.event_shown("trainingjob.queued", other, sees_own) is other


# --- Through the API: ml borrows the node, cv's job within its guarantee preempts it. ---


@pytest.fixture
def preempted(node_fleet, gpu_node, admin_api, member, vision):
    gpu_node(node_fleet)
    quotas = {"quotas": [{"project": "cv", "guaranteed": 8}, {"project": "ml"}]}
    answer = admin_api.request("PUT", f"/api/fleets/{node_fleet.id}/quotas", quotas)
    assert answer.status_code == 200, answer.content
    victim, _ = borrowed_job_running(node_fleet, member)
    owner = submit(vision, "cv", "owner", cards=8)
    assert allocate(fleet_id=node_fleet.id)["preempted"] == 1
    return TrainingJob.objects.get(pk=victim.pk), owner


def read(api, job, events=False) -> str:
    answer = api.get(f"/api/training-jobs/{job.pk}" + ("/events" if events else ""))
    assert answer.status_code == 200, answer.content
    return answer.content.decode()


def test_R23_the_victims_member_reads_its_preemptor_as_another_projects_work(preempted, member_api):
    victim, owner = preempted
    for text in (read(member_api, victim), read(member_api, victim, events=True)):
        assert f"trainingjob-{owner.pk}" not in text and "project cv" not in text
        assert ANOTHER in text
    preemption = json.loads(read(member_api, victim))["preemption"]
    assert preemption["by"] == ANOTHER and set(preemption) == {"by", "why", "at", "deadline"}


def test_R23_the_preemptors_member_reads_its_victims_as_another_projects_work(preempted, vision):
    victim, owner = preempted
    api = Api(vision)
    for text in (read(api, owner), read(api, owner, events=True)):
        assert f"trainingjob-{victim.pk}" not in text and ANOTHER in text
    waiting = json.loads(read(api, owner))["waiting"]
    assert waiting["reason"] == "preempting"
    assert [v["job"] for v in waiting["numbers"]["victims"]] == [ANOTHER]


def test_R23_administrators_and_members_of_both_projects_read_every_name(
    preempted, admin_api, member
):
    victim, owner = preempted
    both = Api(member)
    Membership.objects.create(project=Project.objects.get(slug="cv"), user=member)
    for api in (admin_api, both):
        assert json.loads(read(api, victim))["preemption"]["by"] == f"trainingjob-{owner.pk}"
        assert "project cv" in read(api, victim)
        victims = json.loads(read(api, owner))["waiting"]["numbers"]["victims"]
        assert [v["job"] for v in victims] == [f"trainingjob-{victim.pk}"]
        assert f"trainingjob-{owner.pk}" in read(api, victim, events=True)


def test_R23_who_reads_a_projects_work_by_name(member, vision, admin_user, outsider, project):
    from django.contrib.auth.models import AnonymousUser

    from placement.selectors import projects_read_by

    cv = Project.objects.get(slug="cv")
    mine = projects_read_by(member)
    assert mine(project.pk) and not mine(cv.pk) and not mine(None)
    admin = projects_read_by(admin_user)
    assert admin(project.pk) and admin(cv.pk) and admin(None)  # unrecorded: theirs alone
    for nobody in (outsider, AnonymousUser(), None):
        assert not projects_read_by(nobody)(project.pk)
