"""Issue 38: one training or lifecycle job read by id, answered exactly as its list shows it,
and not found — the same 404, byte for byte but for the id — when the caller may not see its
project (F8); the lists of jobs, deployments and playground sessions narrowed by ``state``
(several comma-separated; any other value a 400 naming ``state`` and what it may be) and by
``project`` (a slug; a project the caller may not see lists nothing, as one that does not
exist)."""

import pytest

from audit.services import Actor
from placement.choices import DeploymentState, JobState, LifecycleKind
from placement.models import Deployment, LifecycleJob, PlaygroundSession, TrainingJob
from placement.services import submission
from placement.services.allocator import allocate
from tests.conftest import SERVE
from tuneplane.models import Project

EVERY_CAPABILITY = ["train", "eval", "serve", "env"]


def _training_job(actor, project, name, n):
    return submission.training_job_submit(
        actor=actor, project=project, name=name, command=["python", "train.py"], env={"A": "1"}
    )


def _lifecycle_job(actor, project, name, n):
    return submission.lifecycle_job_submit(
        actor=actor, project=project, name=name, kind=LifecycleKind.EVAL, script="python eval.py"
    )


def _deployment(actor, project, name, n):
    return submission.deployment_submit(
        actor=actor, project=project, name=name, fleet="lab", **{**SERVE, "port": 8000 + n}
    )


def _playground_session(actor, project, name, n):
    return submission.playground_session_submit(
        actor=actor, project=project, name=name, **{**SERVE, "port": 9000 + n}
    )


# Each list: its model, the states it may be filtered by, how to make one of its records.
LISTS = {
    "training-jobs": (TrainingJob, JobState, _training_job),
    "lifecycle-jobs": (LifecycleJob, JobState, _lifecycle_job),
    "deployments": (Deployment, DeploymentState, _deployment),
    "playground-sessions": (PlaygroundSession, DeploymentState, _playground_session),
}
# Per list, the states its three records are put in, and a value that is another list's state.
STATES = {
    JobState: (["queued", "running", "failed"], "live"),
    DeploymentState: (["live", "stopped", "live"], "running"),
}
JOBS = ["training-jobs", "lifecycle-jobs"]


@pytest.fixture
def lab(make_fleet, gpu_node):
    """A public node Fleet doing every kind of work, with one placeable 8-card node."""
    fleet = make_fleet("lab", capabilities=EVERY_CAPABILITY)
    gpu_node(fleet)
    return fleet


@pytest.fixture
def other_project(db):
    return Project.objects.create(slug="p2", name="Other project")


def make(path, actor, project, name, n=0, state=None):
    model, _, submit = LISTS[path]
    record = submit(actor, project, name, n)
    if state is not None:
        model.objects.filter(pk=record.pk).update(state=state)
    return record


def names(response) -> list[str]:
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["count"] == len(body["results"])
    return sorted(item["name"] for item in body["results"])


# -- one job by id ------------------------------------------------------------------


@pytest.mark.parametrize("path", JOBS)
@pytest.mark.parametrize("reader", ["member_api", "admin_api"])
def test_a_job_by_id_is_exactly_what_its_list_shows(lab, member, request, path, reader):
    api = request.getfixturevalue(reader)
    job = make(path, Actor.of_user(member), "ml", "w")
    assert allocate(fleet_id="lab")["allocated"] == 1  # shown with its attempt and member
    make(path, Actor.of_user(member), "ml", "other")

    response = api.get(f"/api/{path}/{job.pk}")

    assert response.status_code == 200, response.content
    listed = {item["id"]: item for item in api.get(f"/api/{path}").json()["results"]}
    assert response.json() == listed[job.pk]
    assert response.json()["attempts"][0]["members"], "a job shown without its members"
    # an administrator sees the nodes admission found, a member only how many (issue 17)
    assert ("fits_on" in response.json()["admission"]) == (reader == "admin_api")


@pytest.mark.parametrize("path", JOBS)
def test_F8_a_job_the_caller_may_not_see_is_the_404_of_one_that_does_not_exist(
    lab, member, member_api, outsider_api, admin_api, admin_user, other_project, path
):
    model = LISTS[path][0]
    own = make(path, Actor.of_user(member), "ml", "own")
    hidden = make(path, Actor.of_user(admin_user), "p2", "hidden")
    missing = max(model.objects.values_list("pk", flat=True)) + 1

    assert member_api.get(f"/api/{path}/{own.pk}").status_code == 200
    assert admin_api.get(f"/api/{path}/{hidden.pk}").json()["project"] == "p2"
    for api in (member_api, outsider_api):
        seen = api.get(f"/api/{path}/{hidden.pk}")
        absent = api.get(f"/api/{path}/{missing}")
        assert seen.status_code == absent.status_code == 404, seen.content
        assert seen.json()["error"]["code"] == "not_found"
        assert seen.content.replace(str(hidden.pk).encode(), b"ID") == absent.content.replace(
            str(missing).encode(), b"ID"
        )
        assert "p2" not in seen.content.decode() and "hidden" not in seen.content.decode()
    assert outsider_api.get(f"/api/{path}/{own.pk}").status_code == 404


# -- lists narrowed by state and project --------------------------------------------


@pytest.mark.parametrize("path", list(LISTS))
def test_a_list_is_narrowed_to_the_states_asked_for(lab, member, member_api, path):
    states, _ = STATES[LISTS[path][1]]
    for n, state in enumerate(states):
        make(path, Actor.of_user(member), "ml", f"r{n}", n, state)
    named = {state: [f"r{n}" for n, s in enumerate(states) if s == state] for state in states}
    first, second = states[0], states[1]

    assert names(member_api.get(f"/api/{path}")) == ["r0", "r1", "r2"]
    assert names(member_api.get(f"/api/{path}?state={first}")) == named[first]
    both = sorted({*named[first], *named[second]})
    assert names(member_api.get(f"/api/{path}?state={first},{second}")) == both
    assert names(member_api.get(f"/api/{path}?state={first}&state={second}")) == both


@pytest.mark.parametrize("path", list(LISTS))
def test_an_unknown_state_is_a_400_naming_state_and_the_states_it_may_be(
    lab, member, member_api, path
):
    choices = LISTS[path][1]
    states, another_lists_state = STATES[choices]
    make(path, Actor.of_user(member), "ml", "r0")
    for asked in ("bogus", another_lists_state, f"{states[0]},bogus", ""):
        response = member_api.get(f"/api/{path}?state={asked}")
        assert response.status_code == 400, (asked, response.content)
        error = response.json()["error"]
        assert (error["code"], error["field"]) == ("invalid", "state"), error
        assert all(value in error["message"] for value in choices.values), error


@pytest.mark.parametrize("path", list(LISTS))
def test_a_list_is_narrowed_to_a_project_by_slug_and_a_hidden_one_lists_nothing(
    lab, member, member_api, admin_api, admin_user, other_project, path
):
    states, _ = STATES[LISTS[path][1]]
    make(path, Actor.of_user(member), "ml", "mine", 0, states[1])
    make(path, Actor.of_user(admin_user), "p2", "theirs", 1)

    assert names(admin_api.get(f"/api/{path}")) == ["mine", "theirs"]
    assert names(admin_api.get(f"/api/{path}?project=p2")) == ["theirs"]
    assert names(admin_api.get(f"/api/{path}?project=ml")) == ["mine"]
    assert names(admin_api.get(f"/api/{path}?project=ml&state={states[0]}")) == []
    assert names(admin_api.get(f"/api/{path}?project=ml&state={states[1]}")) == ["mine"]
    assert names(member_api.get(f"/api/{path}?project=ml")) == ["mine"]
    hidden = member_api.get(f"/api/{path}?project=p2")
    absent = member_api.get(f"/api/{path}?project=zz")
    assert names(hidden) == [] and hidden.content == absent.content


# -- the OpenAPI document -------------------------------------------------------------


def test_the_openapi_document_names_the_filters_and_the_job_detail_paths(anon_api):
    schema = anon_api.get("/api/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    for path, (_, choices, _) in LISTS.items():
        listed = schema["paths"][f"/api/{path}"]["get"]
        parameters = {parameter["name"]: parameter for parameter in listed["parameters"]}
        state = parameters["state"]
        assert state["in"] == "query" and not state.get("required", False)
        assert state["schema"] == {
            "type": "array",
            "items": {"type": "string", "enum": sorted(choices.values)},
        }
        assert (state["style"], state["explode"]) == ("form", False)
        assert parameters["project"]["schema"] == {"type": "string"}
        assert "400" in listed["responses"]
    for path, (model, _, _) in LISTS.items():
        if path not in JOBS:
            continue
        detail = schema["paths"][f"/api/{path}/{{job_id}}"]["get"]
        item = schema["paths"][f"/api/{path}"]["get"]["responses"]["200"]["content"]
        one = detail["responses"]["200"]["content"]["application/json"]["schema"]
        page = item["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
        items = schema["components"]["schemas"][page]["properties"]["results"]["items"]
        assert one == items == {"$ref": f"#/components/schemas/{model.__name__}"}
        assert {"401", "404"} <= set(detail["responses"])
