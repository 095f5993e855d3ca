"""R22 — the gates again at placement: the allocator never places anything on a Fleet that is
no longer open to the work's project (F8), no longer promises what the work needs (F3), or is
not active. Such work waits ``fleet_closed`` (Q8), saying which gate and nothing of who the
Fleet is open to now; what already runs there runs on (D1); a dry run answers the same. The
reproduced attack: project ml queued on the public Fleet; an administrator made it private to
project cv; when a card freed, ml's job ran on cv's private Fleet."""

import json

import pytest

from audit.services import Actor
from fleets.services import fleet_set_state, fleet_update
from nodes.choices import CommandKind
from nodes.models import NodeCommand
from placement import waits as why
from placement.models import Member, TrainingJob
from placement.services import submission
from placement.services.allocator import allocate, allocate_all
from tests.conftest import SERVE, SYSTEM, Api
from tests.placement.test_preempting import running_for
from tests.placement.test_quotas import submit
from tests.placement.test_running_rules import report
from tuneplane.models import Project

# --- The decision, without a database. ---


def closed(open_to_project=True, capability="train", promised=True, state="active"):
    return why.fleet_closed(
        open_to_project=open_to_project, capability=capability, promised=promised, state=state
    )


def test_R22_every_gate_open_is_no_wait():
    assert closed() is None


def test_R22_a_fleet_closed_to_the_project_says_only_that():
    # Every other gate shut too: a Fleet the project may not see says nothing of itself.
    wait = closed(open_to_project=False, promised=False, state="disabled")
    assert (wait.reason, wait.numbers) == ("fleet_closed", {"gate": "visibility"})
    assert "no longer open to its project" in wait.message
    assert "train" not in wait.message and "disabled" not in wait.message


def test_R22_a_capability_no_longer_promised_names_it():
    wait = closed(capability="serve", promised=False, state="draining")
    assert wait.numbers == {"gate": "capability", "capability": "serve"}
    assert "no longer promises serve" in wait.message and "draining" not in wait.message


@pytest.mark.parametrize("state", ["draining", "disabled"])
def test_R22_a_fleet_not_active_names_its_state(state):
    wait = closed(state=state)
    assert wait.numbers == {"gate": "state", "state": state} and state in wait.message


def test_R22_Q8_fleet_closed_is_in_the_closed_set():
    assert "fleet_closed" in why.REASONS


# --- The pass, on the database. ---


@pytest.fixture
def shared(make_fleet, gpu_node):
    """A public node Fleet, one node of eight cards, for ml (mia) and cv (vic)."""
    fleet = make_fleet("shared", kind="node", capabilities=["train", "serve", "env"])
    gpu_node(fleet)
    return fleet


def fresh(job) -> TrainingJob:
    return TrainingJob.objects.get(pk=job.pk)


def make_private_to(fleet, slug: str) -> None:
    fleet_update(
        actor=SYSTEM, fleet=fleet, visibility="project", project=Project.objects.get(slug=slug)
    )


def test_R22_a_job_queued_on_a_fleet_made_private_waits_fleet_closed(
    shared, member, vision, member_api
):
    queued = submit(member, "ml", "queued", cards=8)
    make_private_to(shared, "cv")

    assert allocate(fleet_id=shared.id) == {"allocated": 0, "waiting": 1, "preempted": 0}
    job = fresh(queued)
    assert job.state == "queued" and not Member.objects.exists()
    assert (job.waiting["reason"], job.waiting["numbers"]) == (
        "fleet_closed",
        {"gate": "visibility"},
    )
    assert job.waiting["position_in_project"] == job.waiting["position_in_fleet"] == 1
    assert job.waiting_history[-1]["reason"] == "fleet_closed"
    # What its member reads names nothing of the project the Fleet is now for.
    shown = member_api.get(f"/api/training-jobs/{job.pk}").content.decode()
    assert "fleet_closed" in shown
    assert '"cv"' not in shown and "Vision" not in shown
    assert "cv" not in json.dumps(job.waiting)

    # The other project's work behind it is placed on its own Fleet; ml's still waits.
    own = submit(vision, "cv", "own", cards=8)
    assert allocate(fleet_id=shared.id) == {"allocated": 1, "waiting": 1, "preempted": 0}
    assert fresh(own).state == "starting" and fresh(queued).state == "queued"


def test_R22_a_fleet_open_again_places_what_waited(shared, member, vision):
    queued = submit(member, "ml", "queued", cards=8)
    make_private_to(shared, "cv")
    allocate(fleet_id=shared.id)
    fleet_update(actor=SYSTEM, fleet=shared, visibility="public")
    assert allocate(fleet_id=shared.id)["allocated"] == 1
    job = fresh(queued)
    assert job.state == "starting" and job.waiting is None


def test_R22_a_fleet_made_private_to_its_own_project_places_it(shared, member):
    queued = submit(member, "ml", "queued", cards=8)
    make_private_to(shared, "ml")
    assert allocate(fleet_id=shared.id)["allocated"] == 1 and fresh(queued).state == "starting"


def test_R22_D1_running_work_on_a_fleet_made_private_runs_on(shared, member, vision):
    running = submit(member, "ml", "running", cards=4)
    allocate(fleet_id=shared.id)
    [one] = Member.objects.filter(attempt__training_job=running)
    report(one)
    second = submit(member, "ml", "second", cards=4)
    make_private_to(shared, "cv")

    assert allocate(fleet_id=shared.id) == {"allocated": 0, "waiting": 1, "preempted": 0}
    assert fresh(running).state == "running"
    assert not NodeCommand.objects.filter(kind=CommandKind.STOP).exists()
    assert fresh(second).waiting["reason"] == "fleet_closed"


def test_R22_a_capability_no_longer_promised_holds_back_only_what_needs_it(
    shared, member, member_api
):
    actor = Actor.of_user(member)
    deployment = submission.deployment_submit(
        actor=actor, project="ml", name="chat", **{**SERVE, "fleet": "shared"}
    )
    environment = submission.environment_submit(
        actor=actor, project="ml", name="env", manifest={"fleet": "shared"}
    )
    answer = member_api.post(f"/api/environments/{environment.pk}/episodes", {"command": ["true"]})
    assert answer.status_code in (200, 201), answer.content
    job = submit(member, "ml", "train", cards=1)
    fleet_update(actor=SYSTEM, fleet=shared, capabilities=["train"])

    assert allocate(fleet_id=shared.id) == {"allocated": 1, "waiting": 2, "preempted": 0}
    assert fresh(job).state == "starting"
    deployment.refresh_from_db()
    revision = deployment.revisions.get()
    assert revision.waiting["0"]["numbers"] == {"gate": "capability", "capability": "serve"}
    episode = environment.episodes.get()
    assert (episode.state, episode.waiting["numbers"]) == (
        "queued",
        {"gate": "capability", "capability": "env"},
    )


@pytest.mark.parametrize("state", ["draining", "disabled"])
def test_R22_work_on_a_fleet_not_active_waits_fleet_closed_by_the_beats_pass(shared, member, state):
    queued = submit(member, "ml", "queued", cards=1)
    fleet_set_state(actor=SYSTEM, fleet=shared, state=state)
    assert allocate_all() == {"fleets": 1, "allocated": 0}
    job = fresh(queued)
    assert job.state == "queued" and not Member.objects.exists()
    assert job.waiting["numbers"] == {"gate": "state", "state": state}
    fleet_set_state(actor=SYSTEM, fleet=shared, state="active")
    assert allocate_all() == {"fleets": 1, "allocated": 1}


def test_R22_Q5_work_whose_fleet_closed_never_preempts(shared, admin_api, member, vision):
    """ml is guaranteed the node; cv borrows it all. ml's job would preempt cv's — until the
    Fleet is made private to cv: then it waits fleet_closed and cv's job runs on."""
    answer = admin_api.request(
        "PUT",
        f"/api/fleets/{shared.id}/quotas",
        {"quotas": [{"project": "ml", "guaranteed": 8}, {"project": "cv"}]},
    )
    assert answer.status_code == 200, answer.content
    borrower = submit(vision, "cv", "borrower", cards=8)
    allocate(fleet_id=shared.id)
    running_for(borrower, 3600)
    owed = submit(member, "ml", "owed", cards=8)
    make_private_to(shared, "cv")
    submit(vision, "cv", "more", cards=8)  # the pass decides, and may preempt, for this one

    assert allocate(fleet_id=shared.id) == {"allocated": 0, "waiting": 2, "preempted": 0}
    assert fresh(borrower).state == "running"
    assert fresh(owed).waiting["reason"] == "fleet_closed"


def test_R22_Q7_a_dry_run_agrees_work_whose_fleet_closed_takes_no_cards(shared, member, vision):
    first = submit(member, "ml", "first", cards=8)
    make_private_to(shared, "cv")
    body = {"project": "cv", "name": "next", "cards": 8, "command": ["true"]}
    answer = Api(vision).post("/api/training-jobs?dry_run=true", body)
    assert answer.status_code == 200, answer.content
    allocation = answer.json()["allocation"]
    assert (allocation["starts"], allocation["waiting"], allocation["preempts"]) == (
        True,
        None,
        [],
    )
    assert fresh(first).waiting is None  # the preview wrote nothing
