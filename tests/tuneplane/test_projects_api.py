"""Projects and their members through the API (administrators only, DESIGN.md §4) and through
``manage.py project``: the same audited services the admin calls (A1); a member added here
sees the project's Fleets (F8)."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from audit.models import AuditEvent
from tests.api_contract import ListContract
from tests.conftest import SYSTEM
from tuneplane import services
from tuneplane.models import Membership, Project

PROJECT_FIELDS = {"slug", "name", "max_priority", "members", "created_at"}


def actions() -> list[str]:
    return list(
        AuditEvent.objects.exclude(action="api_token.created")
        .order_by("id")
        .values_list("action", flat=True)
    )


class TestProjectList(ListContract):
    list_path = "/api/projects"

    def make_listed(self, n):
        project = services.project_create(actor=SYSTEM, slug=f"listed-{n}", name=f"Listed {n}")
        for user in (self.member, self.outsider):  # members are part of the row
            services.membership_add(actor=SYSTEM, project=project, user=user)


# -- who may -------------------------------------------------------------------------

ROUTES = [
    ("GET", "/api/projects", None),
    ("POST", "/api/projects", {"slug": "vision", "name": "Vision"}),
    ("GET", "/api/projects/ml", None),
    ("PATCH", "/api/projects/ml", {"name": "Renamed"}),
    ("POST", "/api/projects/ml/members", {"username": "otto"}),
    ("DELETE", "/api/projects/ml/members/mia", None),
]


def test_anonymous_is_401_on_every_project_route(anon_api, member):
    for method, path, body in ROUTES:
        response = anon_api.request(method, path, body)
        assert response.status_code == 401, (method, path)
        assert response.json()["error"]["code"] == "not_authenticated"
        assert response["WWW-Authenticate"] == "Bearer"


def test_a_member_is_403_on_every_project_route_and_changes_nothing(member_api, outsider):
    """Even a project the member belongs to: projects are an administrator's to manage."""
    for method, path, body in [*ROUTES, ("GET", "/api/projects/no-such-project", None)]:
        response = member_api.request(method, path, body)
        assert response.status_code == 403, (method, path, response.content)
        assert response.json()["error"] == {
            "code": "permission_denied",
            "message": "Only administrators may do this.",
        }
    assert actions() == []
    assert Project.objects.get(slug="ml").name == "Machine learning"
    assert list(Membership.objects.values_list("user__username", flat=True)) == ["mia"]


# -- projects ------------------------------------------------------------------------


def test_A1_an_admin_makes_a_project_with_one_audit_event(admin_api, admin_user):
    response = admin_api.post(
        "/api/projects", {"slug": "vision", "name": "Vision", "max_priority": 5}
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == PROJECT_FIELDS
    assert (body["slug"], body["name"], body["max_priority"], body["members"]) == (
        "vision",
        "Vision",
        5,
        [],
    )
    (event,) = AuditEvent.objects.filter(action="project.created")
    assert event.actor_label == admin_user.username
    assert event.after == {"slug": "vision", "name": "Vision", "max_priority": 5}
    assert actions() == ["project.created"]
    assert admin_api.get("/api/projects/vision").json() == body


def test_max_priority_defaults_to_zero(admin_api):
    response = admin_api.post("/api/projects", {"slug": "vision", "name": "Vision"})
    assert response.status_code == 201 and response.json()["max_priority"] == 0


def test_a_second_project_with_the_same_slug_is_409_naming_the_slug(admin_api, project):
    response = admin_api.post("/api/projects", {"slug": "ml", "name": "Again"})
    assert response.status_code == 409
    assert response.json()["error"] == {
        "code": "already_exists",
        "message": "A project with slug 'ml' already exists.",
        "field": "slug",
    }
    assert Project.objects.get(slug="ml").name == "Machine learning"
    assert actions() == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"slug": "Not A Slug", "name": "x"}, "slug"),
        ({"slug": "-edge", "name": "x"}, "slug"),
        ({"slug": 7, "name": "x"}, "slug"),
        ({"name": "x"}, "slug"),
        ({"slug": "vision"}, "name"),
        ({"slug": "vision", "name": "x", "max_priority": -1}, "max_priority"),
        ({"slug": "vision", "name": "x", "owner": "mia"}, "owner"),
    ],
)
def test_bad_input_is_400_naming_the_field(admin_api, body, field):
    response = admin_api.post("/api/projects", body)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["field"]) == ("invalid", field)
    assert error["message"].startswith(f"{field}: ")
    assert not Project.objects.filter(slug="vision").exists()


def test_the_list_shows_every_project_with_its_members(admin_api, project, member, vision):
    body = admin_api.get("/api/projects").json()
    assert body["count"] == 2
    assert [(row["slug"], row["members"]) for row in body["results"]] == [
        ("cv", ["vic"]),
        ("ml", ["mia"]),
    ]


def test_a_missing_project_is_404_on_every_route(admin_api, outsider):
    for method, path, body in [
        ("GET", "/api/projects/nope", None),
        ("PATCH", "/api/projects/nope", {"name": "x"}),
        ("POST", "/api/projects/nope/members", {"username": "otto"}),
        ("DELETE", "/api/projects/nope/members/otto", None),
    ]:
        response = admin_api.request(method, path, body)
        assert response.status_code == 404, (method, path)
        assert response.json()["error"] == {"code": "not_found", "message": "No project 'nope'."}


def test_an_admin_renames_a_project_and_raises_its_max_priority(admin_api, project):
    response = admin_api.patch("/api/projects/ml", {"name": "ML research", "max_priority": 3})
    assert response.status_code == 200, response.content
    assert (response.json()["name"], response.json()["max_priority"]) == ("ML research", 3)
    (event,) = AuditEvent.objects.filter(action="project.updated")
    assert event.before == {"name": "Machine learning", "max_priority": 0}
    assert admin_api.patch("/api/projects/ml", {"name": "ML research"}).status_code == 200
    assert actions() == ["project.updated"]  # nothing changed, nothing recorded


def test_a_project_slug_never_changes(admin_api, project):
    response = admin_api.patch("/api/projects/ml", {"slug": "ml2"})
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "slug"
    assert Project.objects.filter(slug="ml").exists() and actions() == []
    # Sending back the slug it read is no change.
    assert admin_api.patch("/api/projects/ml", {"slug": "ml", "name": "ML"}).status_code == 200


# -- members -------------------------------------------------------------------------


def test_F8_a_member_added_through_the_api_sees_the_project_fleets(
    admin_api, project, outsider, outsider_api, make_fleet
):
    make_fleet("ml-lab", visibility="project", project=project, capabilities=["train"])
    assert outsider_api.get("/api/fleets/ml-lab").status_code == 404
    response = admin_api.post("/api/projects/ml/members", {"username": "otto"})
    assert response.status_code == 201, response.content
    assert response.json()["members"] == ["otto"]
    assert outsider_api.get("/api/fleets/ml-lab").status_code == 200
    (event,) = AuditEvent.objects.filter(action="membership.added")
    assert event.after == {"project": "ml", "user": "otto"}


def test_adding_a_member_twice_changes_nothing(admin_api, member):
    response = admin_api.post("/api/projects/ml/members", {"username": "mia"})
    assert response.status_code == 201 and response.json()["members"] == ["mia"]
    assert Membership.objects.count() == 1 and actions() == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"username": "nobody"}, "username: no user 'nobody'."),
        ({"username": 5}, "username: Not a valid string."),
        ({}, "username: This field is required."),
    ],
)
def test_adding_an_unknown_user_is_400_naming_username(admin_api, project, body, message):
    response = admin_api.post("/api/projects/ml/members", body)
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "username"
    assert response.json()["error"]["message"] == message
    assert actions() == []


def test_F8_a_member_removed_through_the_api_no_longer_sees_the_project_fleets(
    admin_api, project, member, member_api, make_fleet
):
    make_fleet("ml-lab", visibility="project", project=project, capabilities=["train"])
    assert member_api.get("/api/fleets/ml-lab").status_code == 200
    response = admin_api.delete("/api/projects/ml/members/mia")
    assert response.status_code == 204, response.content
    assert not Membership.objects.exists()
    (event,) = AuditEvent.objects.filter(action="membership.removed")
    assert event.before == {"project": "ml", "user": "mia"}
    assert member_api.get("/api/fleets/ml-lab").status_code == 404


def test_removing_someone_who_is_not_a_member_is_404_naming_them(admin_api, project, outsider):
    response = admin_api.delete("/api/projects/ml/members/otto")
    assert response.status_code == 404
    assert response.json()["error"] == {
        "code": "not_found",
        "message": "'otto' is not a member of project 'ml'.",
    }


def test_the_openapi_document_names_every_project_operation(anon_api):
    schema = anon_api.get("/api/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    operations = {
        (path, method)
        for path, item in schema["paths"].items()
        if path.startswith("/api/projects")
        for method in item
        if method != "parameters"
    }
    assert operations == {
        ("/api/projects", "get"),
        ("/api/projects", "post"),
        ("/api/projects/{slug}", "get"),
        ("/api/projects/{slug}", "patch"),
        ("/api/projects/{slug}/members", "post"),
        ("/api/projects/{slug}/members/{username}", "delete"),
    }
    body = schema["paths"]["/api/projects"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["$ref"] == "#/components/schemas/ProjectCreateRequest"
    assert {"401", "403", "409"} <= set(schema["paths"]["/api/projects"]["post"]["responses"])


# -- manage.py project ----------------------------------------------------------------


def run_project(*arguments) -> str:
    out = StringIO()
    call_command("project", *arguments, stdout=out)
    return out.getvalue()


def test_A1_the_command_makes_a_project_with_members_and_says_so(member, outsider):
    Membership.objects.all().delete()
    Project.objects.all().delete()
    said = run_project("ml", "--name", "Machine learning", "--member", "mia", "--member", "otto")
    assert said.splitlines() == [
        "Project 'ml' created (name: 'Machine learning').",
        "  mia: added as a member.",
        "  otto: added as a member.",
    ]
    project = Project.objects.get(slug="ml")
    assert project.name == "Machine learning"
    assert sorted(project.members.values_list("username", flat=True)) == ["mia", "otto"]
    assert actions() == ["project.created", "membership.added", "membership.added"]
    assert AuditEvent.objects.get(action="project.created").actor_label == "manage.py project"


def test_the_command_run_twice_changes_nothing_the_second_time(member, outsider):
    run_project("vision", "--name", "Vision", "--member", "otto")
    before = actions()
    said = run_project("vision", "--name", "Vision", "--member", "otto")
    assert said.splitlines() == ["Project 'vision' exists, unchanged.", "  otto: already a member."]
    assert actions() == before


def test_the_command_updates_an_existing_project_and_adds_members(project, member, outsider):
    said = run_project("ml", "--name", "ML research", "--max-priority", "4", "--member", "otto")
    assert said.splitlines() == [
        "Project 'ml' updated (name: 'Machine learning' → 'ML research'; max_priority: 0 → 4).",
        "  otto: added as a member.",
    ]
    assert actions() == ["project.updated", "membership.added"]
    members = Project.objects.get(slug="ml").members.order_by("username")
    assert list(members.values_list("username", flat=True)) == ["mia", "otto"]


def test_the_command_with_an_unknown_member_changes_nothing(db):
    with pytest.raises(CommandError, match=r"--member: no user 'nobody'\."):
        run_project("vision", "--name", "Vision", "--member", "nobody")
    assert not Project.objects.filter(slug="vision").exists() and actions() == []


def test_the_command_refuses_a_bad_slug_naming_the_field(db):
    with pytest.raises(CommandError, match=r"^slug: "):
        run_project("Not A Slug")
    assert not Project.objects.exists()
