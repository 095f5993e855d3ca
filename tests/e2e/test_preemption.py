"""Preemption on a real agent (DESIGN §8 Q4–Q8): project ml borrows the whole node; cv,
guaranteed its cards, submits. The allocator preempts ml's job, which gets SIGTERM through
the agent's own stop and ends within its grace. The attempt ends `preempted` and the job
goes back to the queue without using an attempt. cv's job runs on the freed cards, and
ml's runs again once they are free."""

import pytest

from placement.models import Member
from tests.conftest import Api

from .agents import wait_until
from .running import job_shown, state_is, submit

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]

# The worker's settings: preempt at once (no minimum runtime), a grace long enough to see
# SIGTERM honoured and short enough to wait out.
PREEMPTING = {"TUNEPLANE_PREEMPT_MIN_RUNTIME": "0", "TUNEPLANE_PREEMPT_GRACE": "20"}
# Its first attempt waits to be stopped, and ends 143 on SIGTERM; any later one succeeds.
BORROWER = (
    'if [ "$TUNEPLANE_ATTEMPT" = 1 ]; then trap "exit 143" TERM; echo up; '
    "sleep 600 & wait; else echo again; fi"
)


@pytest.mark.parametrize("running_node", [PREEMPTING], indirect=True)
def test_Q4_Q5_Q6_Q8_borrowed_work_is_preempted_for_work_within_a_guarantee(
    running_node, admin_api, member_api, vision
):
    vision_api = Api(vision)
    quotas = {"quotas": [{"project": "cv", "guaranteed": 8}, {"project": "ml"}]}
    assert admin_api.request("PUT", "/api/fleets/gpu-lab/quotas", quotas).status_code == 200
    borrower = submit(member_api, name="borrows", cards=8, script=BORROWER, max_attempts=1)
    wait_until(lambda: state_is(member_api, borrower["id"], "running"), 30, "ml's job running")
    assert Member.objects.get(attempt__training_job_id=borrower["id"]).borrowed  # Q4

    owner = submit(vision_api, project="cv", name="owner", cards=8, command=["sleep", "2"])
    preempted = wait_until(
        lambda: state_is(member_api, borrower["id"], "queued"), 60, "ml's job queued again"
    )
    # Q6: its members got SIGTERM (it exited 143 itself, within the grace, not SIGKILLed);
    # the attempt ended preempted, never a failure, and the job kept no reason but that.
    [attempt] = preempted["attempts"]
    assert (attempt["state"], attempt["reason"]) == ("preempted", "preempted")
    [member] = Member.objects.filter(attempt__training_job_id=borrower["id"])
    assert (member.state, member.exit_code) == ("cancelled", 143)
    assert preempted["reason"] == "preempted"
    # cv's job, to ml's member, is another project's work; administrators read its name (R23).
    assert preempted["preemption"]["by"] == "another project's work"
    shown_to_admin = job_shown(admin_api, borrower["id"])["preemption"]["by"]
    assert shown_to_admin == f"trainingjob-{owner['id']}"

    # cv's job runs on the freed cards; ml's waits, and says why.
    wait_until(lambda: state_is(vision_api, owner["id"], "running", "succeeded"), 60, "cv runs")
    # Its one attempt was not used up by the preemption: it runs again, and succeeds.
    done = wait_until(lambda: state_is(member_api, borrower["id"], "succeeded"), 90, "ml again")
    assert [a["state"] for a in done["attempts"]] == ["preempted", "succeeded"]
    assert job_shown(vision_api, owner["id"])["state"] == "succeeded"
