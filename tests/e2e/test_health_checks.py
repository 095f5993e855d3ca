"""A Fleet's health check on a real node (issue 48: H5, H6): a real agent as root runs the
Fleet's check command on each card alone, confined as a member is (its own uid, only its card),
through a real gateway; this test is the beat, calling the sweep. A check that fails keeps the
new node from taking work — each card quarantined with the check's output, the job waiting
`health` — and once the operator fixes the check, the cards pass, return, and the job runs."""

import time

import pytest

from audit.services import Actor
from fleets.services import fleet_update
from nodes import checks
from nodes.models import Node
from nodes.services.checks import health_checks_run
from placement.models import Member, TrainingJob

from .agents import wait_until
from .running import state_is, submit
from .test_card_fault import faulting_node

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]

FAILING = 'echo "uid=$(id -u) cards=$CUDA_VISIBLE_DEVICES"; exit 3'
PASSING = "echo ok"


def configure(fleet, **config):
    return fleet_update(actor=Actor.system("test"), fleet=fleet, config={**fleet.config, **config})


def swept(until, timeout: float, what: str):
    """The beat's sweep, every half second, until ``until()`` says what it waits for."""

    def once():
        health_checks_run()
        return until()

    return wait_until(once, timeout, what=what, interval=0.5)


def states(node) -> dict:
    return {uuid: r["state"] for uuid, r in Node.objects.get(pk=node.pk).card_checks.items()}


def test_H5_H6_a_failing_check_keeps_a_new_node_from_work_until_it_passes(
    require_redis, tmp_path, console_pki, node_fleet, mint, member, member_api, capsys
):
    fleet = configure(
        node_fleet,
        health_check={"command": FAILING, "interval_seconds": 10, "timeout_seconds": 30},
        health_returns_after=1,
    )
    with faulting_node(tmp_path, console_pki, fleet, mint, member, require_redis) as (node, _):
        job = submit(member_api, cards=1, script="echo trained")
        started = time.time()
        swept(
            lambda: len(states(node)) == 8 and set(states(node).values()) == {checks.FAILED},
            90,
            "every card's check failed",
        )
        failed_after = time.time() - started
        node = Node.objects.get(pk=node.pk)
        assert len(node.unhealthy_cards) == 8 and node.card_count == 0
        for device in node.inventory["devices"]:
            record = node.card_checks[device["uuid"]]
            assert record["exit_code"] == 3, record
            said = dict(part.split("=") for part in record["output"].split())
            assert said["uid"] != "0", record  # confined: never root
            assert said["cards"] == str(device["index"]), record  # its own card alone
            reason = node.unhealthy_cards[device["uuid"]]["reason"]
            assert reason.startswith("health check failed (exit 3): uid="), reason
        assert not Member.objects.filter(attempt__training_job_id=job["id"]).exists()
        waiting = TrainingJob.objects.get(pk=job["id"]).waiting
        assert waiting["reason"] == "health", waiting

        configure(fleet, health_check={"command": PASSING, "interval_seconds": 10})
        fixed = time.time()
        swept(
            lambda: Member.objects.filter(
                attempt__training_job_id=job["id"], state__in=("running", "succeeded")
            ).exists(),
            90,
            "the job placed on a card whose check passed",
        )
        placed_after = time.time() - fixed
        done = wait_until(
            lambda: state_is(member_api, job["id"], "succeeded", "failed"), 60, what="job ended"
        )
        assert done["state"] == "succeeded", done
        node = Node.objects.get(pk=node.pk)
        (card,) = done["attempts"][0]["members"][0]["cards"]
        assert card["uuid"] not in node.unhealthy_cards
        # The member left its card: it owes a check before the next member (H5).
        swept(
            lambda: Node.objects.get(pk=node.pk).card_checks[card["uuid"]]["state"]
            in (checks.DUE, checks.CHECKING),
            60,
            "its card owed a check after the member",
        )
    with capsys.disabled():
        print(
            f"\nH5: 8 failing checks on a new node: {failed_after:.1f} s; "
            f"check fixed -> job placed: {placed_after:.1f} s (interval 10 s)"
        )
