"""Sharing a node Fleet between projects on a real agent (DESIGN §8 Q1–Q3, Q8): project ml
borrows the whole node while cv, guaranteed it, has nothing queued; then both queue, each
saying why it waits and where; when ml's job ends, cv's job within its guarantee gets the
cards before ml's older borrowed one, whose reason moves; and ml's runs once cv's is done."""

import pytest
from django.contrib.auth import get_user_model

from placement.models import Member
from tests.conftest import Api
from tuneplane.models import Membership, Project

from .agents import wait_until
from .running import job_shown, state_is, submit

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def vision_api(db):
    project = Project.objects.create(slug="cv", name="Vision")
    user = get_user_model().objects.create_user("vic", password="vic-password-1")
    Membership.objects.create(project=project, user=user)
    return Api(user)


def test_Q3_Q8_work_within_its_guarantee_takes_freed_cards_before_older_borrowed_work(
    running_node, admin_api, member_api, vision_api
):
    node, *_ = running_node
    quotas = {"quotas": [{"project": "cv", "guaranteed": 8}, {"project": "ml"}]}
    assert admin_api.request("PUT", "/api/fleets/gpu-lab/quotas", quotas).status_code == 200
    short = ["sh", "-c", "sleep 4"]
    borrower = submit(member_api, name="borrows", cards=8, command=short)
    running = wait_until(lambda: state_is(member_api, borrower["id"], "running"), 30, "running")
    assert running["waiting"] is None
    assert Member.objects.get(attempt__training_job_id=borrower["id"]).borrowed  # Q3

    older = submit(member_api, name="older", cards=8, command=short)
    owner = submit(vision_api, project="cv", name="owner", cards=8, command=short)

    def waiting(api, job):
        return wait_until(lambda: job_shown(api, job["id"])["waiting"], 20, "a reason to wait")

    older_wait, owner_wait = waiting(member_api, older), waiting(vision_api, owner)
    assert older_wait["reason"] == "capacity" and older_wait["numbers"]["free"] == 0
    assert (older_wait["position_in_fleet"], owner_wait["position_in_fleet"]) == (1, 2)
    assert owner_wait["position_in_project"] == 1

    # The borrower ends; its cards are released after cleanup; cv's job within its
    # guarantee is placed before ml's older borrowed one.
    wait_until(lambda: state_is(vision_api, owner["id"], "running", "succeeded"), 60, "cv runs")
    assert job_shown(member_api, older["id"])["state"] == "queued"
    moved = wait_until(
        lambda: (w := job_shown(member_api, older["id"])["waiting"])
        and w["numbers"].get("guaranteed_first")
        and w,
        20,
        "ml's reason moving",
    )
    assert moved["reason"] == "capacity" and "guarantees" in moved["message"]
    assert not Member.objects.get(attempt__training_job_id=owner["id"]).borrowed
    # cv's job ends; ml's runs on the same cards.
    done = wait_until(lambda: state_is(member_api, older["id"], "running", "succeeded"), 60, "ml")
    assert done["waiting"] is None and done["attempts"][0]["members"][0]["node"] == node.id
