"""Quotas on a shared node Fleet, on the real database (DESIGN §8 Q1–Q3): set through the
API as a whole and audited, read with what each holds, borrows and has queued, and obeyed
by the allocator. The decision itself, without a database, is test_sharing.py's."""

import pytest

from audit.models import AuditEvent
from audit.services import Actor
from placement.models import Member, TrainingJob, Usage
from placement.services import submission
from placement.services.allocator import allocate
from tests.conftest import Api
from tuneplane.models import Project

QUOTAS = "/api/fleets/gpu-lab/quotas"


@pytest.fixture
def lab(node_fleet, gpu_node):
    gpu_node(node_fleet)
    return node_fleet


def submit(user, project, name, cards=8, **fields) -> TrainingJob:
    return submission.training_job_submit(
        actor=Actor.of_user(user),
        project=project,
        name=name,
        command=["python", "train.py"],
        cards=cards,
        **fields,
    )


def state(job) -> str:
    return TrainingJob.objects.get(pk=job.pk).state


def test_Q1_quotas_are_replaced_as_a_whole_audited_and_read_back(lab, admin_api, project, vision):
    body = {
        "quotas": [
            {"project": "ml", "series": "h100", "guaranteed": 8, "limit": 16, "weight": 2},
            {"project": "cv", "guaranteed": 0, "limit": None},
        ]
    }
    response = admin_api.request("PUT", QUOTAS, body)
    assert response.status_code == 200, response.content
    rows = response.json()["quotas"]
    assert [
        (r["project"], r["series"], r["guaranteed"], r["limit"], r["weight"]) for r in rows
    ] == [
        ("cv", "", 0, None, 1),
        ("ml", "h100", 8, 16, 2),
    ]
    assert all((r["in_use"], r["borrowed"], r["queued"]) == (0, 0, 0) for r in rows)
    again = admin_api.request("PUT", QUOTAS, {"quotas": [{"project": "ml", "guaranteed": 4}]})
    assert [(r["project"], r["series"]) for r in again.json()["quotas"]] == [("ml", "")]
    events = AuditEvent.objects.filter(action="fleet.quotas_replaced").order_by("pk")
    assert events.count() == 2
    assert len(events[1].before["quotas"]) == 2 and events[1].after["quotas"] == [
        {"project": "ml", "series": "", "guaranteed": 4, "limit": None, "weight": 1}
    ]


def test_Q1_a_limit_below_its_guarantee_or_an_unknown_project_is_refused_naming_it(
    lab, admin_api, project
):
    response = admin_api.request(
        "PUT", QUOTAS, {"quotas": [{"project": "ml", "guaranteed": 8, "limit": 4}]}
    )
    assert response.status_code == 400, response.content
    assert "quotas[0].limit" in response.content.decode()
    response = admin_api.request("PUT", QUOTAS, {"quotas": [{"project": "nope"}]})
    assert response.status_code == 400 and "quotas[0].project" in response.content.decode()
    duplicate = [{"project": "ml"}, {"project": "ml", "guaranteed": 2}]
    response = admin_api.request("PUT", QUOTAS, {"quotas": duplicate})
    assert response.status_code == 400 and "quotas[1]" in response.content.decode()
    assert not AuditEvent.objects.filter(action="fleet.quotas_replaced").exists()


def test_Q1_members_read_their_own_projects_rows_and_only_administrators_set_them(
    lab, admin_api, member_api, vision
):
    admin_api.request(
        "PUT", QUOTAS, {"quotas": [{"project": "ml", "guaranteed": 2}, {"project": "cv"}]}
    )
    mine = member_api.get(QUOTAS)
    assert mine.status_code == 200
    assert [r["project"] for r in mine.json()["quotas"]] == ["ml"]
    assert member_api.request("PUT", QUOTAS, {"quotas": []}).status_code == 403
    assert Api(vision).get("/api/fleets/no-such-fleet/quotas").status_code == 404


def test_Q3_the_allocator_places_work_within_its_guarantee_before_older_borrowed_work(
    lab, admin_api, member, vision
):
    admin_api.request(
        "PUT", QUOTAS, {"quotas": [{"project": "cv", "guaranteed": 8}, {"project": "ml"}]}
    )
    borrower = submit(member, "ml", "early", cards=8)
    owner = submit(vision, "cv", "late", cards=8)
    allocate(fleet_id=lab.id)
    assert (state(borrower), state(owner)) == ("queued", "starting")
    member_row = Member.objects.get(attempt__training_job=owner)
    assert (member_row.project.slug, member_row.quota_series, member_row.borrowed) == (
        "cv",
        "",
        False,
    )
    rows = {r["project"]: r for r in admin_api.get(QUOTAS).json()["quotas"]}
    assert (rows["cv"]["in_use"], rows["cv"]["borrowed"]) == (8, 0)
    assert (rows["ml"]["in_use"], rows["ml"]["queued"]) == (0, 8)
    allocate(fleet_id=lab.id)  # the next pass counts the cards held since the last
    assert Usage.objects.filter(fleet=lab, project__slug="cv").exists()


def test_Q3_borrowed_work_is_marked_and_never_passes_a_limit(lab, admin_api, member):
    admin_api.request("PUT", QUOTAS, {"quotas": [{"project": "ml", "guaranteed": 2, "limit": 6}]})
    jobs = [submit(member, "ml", f"j{n}", cards=2) for n in range(4)]
    allocate(fleet_id=lab.id)
    assert [state(job) for job in jobs] == ["starting", "starting", "starting", "queued"]
    borrowed = [Member.objects.get(attempt__training_job=job).borrowed for job in jobs[:3]]
    assert borrowed == [False, True, True]
    [row] = admin_api.get(QUOTAS).json()["quotas"]
    assert (row["in_use"], row["borrowed"], row["queued"]) == (6, 4, 2)


def test_Q3_a_jobs_priority_is_capped_by_its_project(lab, member):
    with pytest.raises(Exception) as refused:
        submit(member, "ml", "urgent", cards=1, priority=5)
    assert "priority" in str(refused.value) and "at most 0" in str(refused.value)
    Project.objects.filter(slug="ml").update(max_priority=10)
    assert submit(member, "ml", "urgent", cards=1, priority=5).priority == 5


def test_Q3_within_a_project_a_higher_priority_goes_first(lab, admin_api, member):
    Project.objects.filter(slug="ml").update(max_priority=10)
    admin_api.request("PUT", QUOTAS, {"quotas": [{"project": "ml"}]})
    first = submit(member, "ml", "first", cards=8)
    urgent = submit(member, "ml", "urgent", cards=8, priority=3)
    allocate(fleet_id=lab.id)
    assert (state(first), state(urgent)) == ("queued", "starting")


def test_Q3_an_administrator_raises_a_projects_priority_cap_audited(project, admin_user):
    from tuneplane.services import project_update

    project_update(actor=Actor.of_user(admin_user), project=project, max_priority=5)
    project.refresh_from_db()
    event = AuditEvent.objects.get(action="project.updated")
    assert project.max_priority == 5
    assert (event.before, event.after) == ({"max_priority": 0}, {"max_priority": 5})


def test_Q8_a_queued_job_says_why_it_waits_each_change_is_kept_and_null_once_placed(
    lab, member, member_api
):
    first = submit(member, "ml", "first", cards=8)
    second = submit(member, "ml", "second", cards=8)
    path = f"/api/training-jobs/{second.pk}"
    assert member_api.get(path).json()["waiting"] is None  # no pass has looked at it yet
    allocate(fleet_id=lab.id)
    shown = member_api.get(path).json()
    waiting = shown["waiting"]
    assert waiting["reason"] == "priority" and waiting["numbers"]["ahead"] == 1
    assert (waiting["position_in_project"], waiting["position_in_fleet"]) == (1, 1)
    since = waiting["since"]
    allocate(fleet_id=lab.id)  # the cards are held now: capacity, with its numbers
    waiting = member_api.get(path).json()["waiting"]
    assert (waiting["reason"], waiting["numbers"]) == ("capacity", {"needs": 8, "free": 0})
    assert waiting["message"] == "needs 8 cards; 0 free" and waiting["since"] > since
    allocate(fleet_id=lab.id)  # nothing changed: nothing written, since kept
    again = member_api.get(path).json()
    assert again["waiting"]["since"] == waiting["since"]
    assert [change["reason"] for change in again["waiting_history"]] == ["priority", "capacity"]
    assert member_api.get(f"/api/training-jobs/{first.pk}").json()["waiting"] is None


def test_Q1_Q3_the_quotas_are_scraped_as_gauges(lab, admin_api, member):
    from django.test import Client

    from tests.tuneplane.test_metrics import scrape, value

    admin_api.request("PUT", QUOTAS, {"quotas": [{"project": "ml", "guaranteed": 2, "limit": 6}]})
    for n in range(4):
        submit(member, "ml", f"j{n}", cards=2)
    allocate(fleet_id=lab.id)
    figures = scrape(Client(REMOTE_ADDR="127.0.0.1"))
    labels = {"fleet": "gpu-lab", "project": "ml", "series": ""}
    shown = {
        name: value(figures, f"tuneplane_quota_{name}", **labels)
        for name in ("guaranteed", "limit", "in_use", "borrowed", "queued")
    }
    assert shown == {"guaranteed": 2, "limit": 6, "in_use": 6, "borrowed": 4, "queued": 2}


def test_Q2_a_request_that_can_never_fit_its_projects_limit_is_refused_with_the_arithmetic(
    lab, admin_api, member_api
):
    admin_api.request("PUT", QUOTAS, {"quotas": [{"project": "ml", "limit": 4}]})
    body = {"project": "ml", "name": "big", "cards": 8, "command": ["true"]}
    refused = member_api.post("/api/training-jobs", body)
    assert refused.status_code == 422, refused.content
    error = refused.json()["error"]
    assert error["reason"] == "quota"
    assert error["message"] == (
        "project ml may hold at most 4 cards on gpu-lab; this asks 8 (rule Q2)."
    )
    assert not TrainingJob.objects.exists()  # nothing written
    served = {"project": "ml", "name": "chat", "fleet": "gpu-lab", "cards": 6, "port": 8080}
    served["command"] = ["python", "-m", "http.server"]
    refused = member_api.post("/api/deployments", served)
    assert refused.status_code == 422 and refused.json()["error"]["reason"] == "quota"


def test_Q2_a_request_within_its_limit_but_not_the_free_cards_queues(lab, admin_api, member):
    admin_api.request("PUT", QUOTAS, {"quotas": [{"project": "ml", "limit": 8}]})
    running = submit(member, "ml", "running", cards=8)
    allocate(fleet_id=lab.id)
    waiting = submit(member, "ml", "waiting", cards=8)  # admitted: it fits the limit alone
    allocate(fleet_id=lab.id)
    assert (state(running), state(waiting)) == ("starting", "queued")
    assert TrainingJob.objects.get(pk=waiting.pk).waiting["reason"] == "quota"


def test_Q3_a_pass_reads_the_scripts_and_env_of_the_jobs_it_places_only(lab, member):
    """The queue is read by its numbers; what a job runs is read for the placed ones, in one
    query: a pass's bytes do not grow with the scripts of what waits."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    placed = submit(member, "ml", "placed", cards=8, env={"SECRET": "x" * 1000})
    waiting = [submit(member, "ml", f"w{n}", cards=8, env={"BIG": "y" * 1000}) for n in range(3)]
    with CaptureQueriesContext(connection) as captured:
        allocate(fleet_id=lab.id)
    reads = [q["sql"] for q in captured if q["sql"].startswith("SELECT") and '"env"' in q["sql"]]
    jobs = [sql for sql in reads if "placement_trainingjob" in sql]
    assert len(jobs) == 1 and str(placed.pk) in jobs[0], jobs
    assert all(f"IN ({job.pk}" not in jobs[0] for job in waiting)
    assert state(placed) == "starting"
    command = Member.objects.get(attempt__training_job=placed).command
    assert command.payload["env"]["SECRET"] == "x" * 1000  # the payload has what it runs


def test_Q7_a_dry_run_answers_what_admission_decides_and_where_it_queues_writing_nothing(
    lab, member, member_api
):
    from audit.models import AuditEvent as Event

    submit(member, "ml", "ahead", cards=8)
    events, jobs = Event.objects.count(), TrainingJob.objects.count()
    body = {"project": "ml", "name": "probe", "cards": 4, "command": ["true"]}
    answer = member_api.post("/api/training-jobs?dry_run=true", body)
    assert answer.status_code == 200, answer.content
    shown = answer.json()
    assert (shown["dry_run"], shown["id"], shown["state"]) == (True, None, "queued")
    assert shown["admission"]["fleet"] == "gpu-lab"
    assert shown["queue"] == {"position_in_project": 2, "position_in_fleet": 2}
    assert (Event.objects.count(), TrainingJob.objects.count()) == (events, jobs)
    refused = member_api.post("/api/training-jobs?dry_run=true", {**body, "cards": 64})
    assert refused.status_code == 422  # a refusal is the same refusal


def test_Q8_the_admin_lists_why_each_queued_job_waits(lab, member, client, admin_user):
    submit(member, "ml", "first", cards=8)
    waiting = submit(member, "ml", "second", cards=8)
    allocate(fleet_id=lab.id)
    allocate(fleet_id=lab.id)
    client.force_login(admin_user)
    listing = client.get("/admin/placement/trainingjob/").content.decode()
    assert "capacity: needs 8 cards; 0 free · #1 in its project, #1 on its Fleet" in listing
    page = client.get(f"/admin/placement/trainingjob/{waiting.pk}/change/").content.decode()
    assert "priority (" in page and "capacity (" in page  # each change of reason, in order
    assert page.index("priority (") < page.index("capacity (")


def test_Q1_the_same_quotas_again_change_nothing_and_record_nothing(lab, admin_api, project):
    body = {"quotas": [{"project": "ml", "guaranteed": 2}]}
    admin_api.request("PUT", QUOTAS, body)
    admin_api.request("PUT", QUOTAS, body)
    admin_api.request("PUT", "/api/fleets/gpu-lab/quotas", {"quotas": []})
    admin_api.request("PUT", "/api/fleets/gpu-lab/quotas", {"quotas": []})
    assert AuditEvent.objects.filter(action="fleet.quotas_replaced").count() == 2


def test_Q8_a_job_placed_no_longer_carries_its_reason_to_wait(lab, member, gpu_node):
    submit(member, "ml", "first", cards=8)
    second = submit(member, "ml", "second", cards=8)
    allocate(fleet_id=lab.id)
    assert TrainingJob.objects.get(pk=second.pk).waiting is not None
    gpu_node(lab, address="10.0.0.2:1")  # a second machine joins
    allocate(fleet_id=lab.id)
    placed = TrainingJob.objects.get(pk=second.pk)
    assert placed.state == "starting" and placed.waiting is None
    assert [c["reason"] for c in placed.waiting_history] == ["priority"]  # kept


def test_Q8_each_change_of_a_replicas_reason_to_wait_is_kept_with_its_rank(lab, member, member_api):
    from tests.conftest import SERVE

    body = {"project": "ml", "name": "chat", "cards": 8, "replicas": 2, **SERVE}
    created = member_api.post("/api/deployments", body)
    assert created.status_code == 201, created.content
    allocate(fleet_id=lab.id)  # replica 0 placed; 1 waits for the cards it took
    allocate(fleet_id=lab.id)  # they are held now: capacity
    allocate(fleet_id=lab.id)  # nothing changed: nothing kept
    [revision] = member_api.get(f"/api/deployments/{created.json()['id']}").json()["revisions"]
    assert revision["waiting"]["1"]["reason"] == "capacity"
    assert [(c["rank"], c["reason"]) for c in revision["waiting_history"]] == [
        (1, "priority"),
        (1, "capacity"),
    ]
