"""Attacks through the console on a real node (R15, R21, R22): a gateway, a Celery worker and
the agent as root, its members confined under the runtime (running_node); project cv (A,
vic) and project ml (B, mia, the attacker) on the one node of the public Fleet gpu-lab. A's
job holds a secret in its env and prints it to its own log; whatever B reads — its job,
its logs — is read back whole, and A's secret and A's name appear nowhere in it."""

import json
import time

import pytest
from django.utils import timezone

from fleets.models import Fleet
from fleets.services import fleet_update
from nodes import bus
from nodes.agent.wire import LOG_TAIL_MAX
from nodes.models import ControlSession, LogFetch
from placement.models import CardHold, Member
from tests.conftest import SYSTEM, Api
from tests.e2e.agents import wait_until
from tests.e2e.running import state_is, submit
from tuneplane.models import Project

from .conftest import SECRET

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]

# The members' log cap, for the worker that makes their starts (R21).
LOG_CAP = 4 << 20


def victim(api, **body):
    """A's job: its secret in its env and in its own log, running until cancelled."""
    script = 'echo "a: $KEY"; exec sleep 300'
    return submit(api, project="cv", env={"KEY": SECRET}, script=script, **body)


def cancelled(api, job_id) -> None:
    assert api.post(f"/api/training-jobs/{job_id}/cancel").status_code in (200, 202)
    wait_until(lambda: state_is(api, job_id, "cancelled"), what="cancelled")


@pytest.mark.parametrize(
    "running_node", [{"TUNEPLANE_MEMBER_LOG_BYTES": str(LOG_CAP)}], indirect=True
)
def test_R15_R21_the_largest_log_tail_never_ends_the_nodes_stream_nor_touches_another_tenant(
    running_node, member_api, vision
):
    """B's member writes one 16 MiB line — past its log's cap (4 MiB here), gRPC's 1 MiB
    message and the 512 KiB tail — while A's job runs beside it. The log on disk stays
    within its cap and one read; the API's largest tail comes back whole; a console asking
    the node for 4 MiB gets the agent's cap; the node's control session is the same one
    throughout (an answer past gRPC's limit once ended the stream, RESOURCE_EXHAUSTED);
    A's job runs on with its log as it wrote it, and nothing B reads holds A's secret."""
    node, _, directory, _, _ = running_node
    vic = Api(vision)
    a = victim(vic, cards=1)
    wait_until(lambda: state_is(vic, a["id"], "running"), what="A's job running")
    wait_until(lambda: SECRET in vic.get(f"/api/training-jobs/{a['id']}/logs").content.decode())
    session = ControlSession.objects.get(node=node, closed_at__isnull=True)
    job = submit(
        member_api,
        cards=1,
        script="python3 -c \"import sys; sys.stdout.write('x' * (16 << 20))\"; echo; echo end",
    )
    wait_until(lambda: state_is(member_api, job["id"], "succeeded"), what="success")
    member = Member.objects.get(attempt__training_job_id=job["id"])
    on_disk = directory / "logs" / f"{member.command_id}.log"
    assert on_disk.stat().st_size <= LOG_CAP + 64 * 1024, on_disk.stat().st_size
    largest = member_api.get(f"/api/training-jobs/{job['id']}/logs?tail_bytes={LOG_TAIL_MAX}")
    assert largest.status_code == 200, largest.content[:300]
    output = largest.json()["output"]
    assert len(output) == LOG_TAIL_MAX and output.endswith("x\nend\n")
    over = member_api.get(f"/api/training-jobs/{job['id']}/logs?tail_bytes={LOG_TAIL_MAX + 1}")
    assert over.status_code == 400 and over.json()["error"]["field"] == "tail_bytes"
    asked = LogFetch.objects.create(  # a console asking past the cap: the agent trims
        node=node, member=member.command_id, tail_bytes=4 << 20, created_at=timezone.now()
    )
    bus.publish_on_commit(bus.COMMANDS, node.id)
    answered = wait_until(
        lambda: LogFetch.objects.filter(pk=asked.pk, answered_at__isnull=False).first(),
        what="the node's answer",
    )
    assert len(answered.data) == LOG_TAIL_MAX
    time.sleep(2)  # two heartbeats: a stream ended by the answer would show by now
    assert ControlSession.objects.get(node=node, closed_at__isnull=True).pk == session.pk
    # The other tenant: running on, its log its own; nothing of it in what B read.
    assert state_is(vic, a["id"], "running")
    assert vic.get(f"/api/training-jobs/{a['id']}/logs").json()["output"] == f"a: {SECRET}\n"
    read_by_b = output + bytes(answered.data).decode(errors="replace")
    read_by_b += member_api.get(f"/api/training-jobs/{job['id']}").content.decode()
    assert SECRET not in read_by_b and '"cv"' not in read_by_b and "Vision" not in read_by_b
    cancelled(vic, a["id"])


def test_R22_a_job_queued_on_a_fleet_made_private_never_runs_there_when_a_card_frees(
    running_node, member_api, vision
):
    """The review's: B queued on the public Fleet; an administrator made it private to A;
    when a card freed, B's job ran on A's private Fleet. Here A's job holds the node's
    eight cards, B's waits for them, the Fleet is made A's, and A cancels: the cards come
    free on the real node, and the pass that follows — and the one after A's next job
    ran there and freed them again — leaves B's job queued, ``fleet_closed``, naming
    nothing of A."""
    node = running_node[0]
    vic = Api(vision)
    a = victim(vic, cards=8)
    wait_until(lambda: state_is(vic, a["id"], "running"), what="A's job running")
    b = submit(member_api, cards=8, script="echo b-ran")
    wait_until(lambda: member_api.get(f"/api/training-jobs/{b['id']}").json()["waiting"])
    fleet_update(
        actor=SYSTEM,
        fleet=Fleet.objects.get(pk=node.fleet_id),
        visibility="project",
        project=Project.objects.get(slug="cv"),
    )
    cancelled(vic, a["id"])
    wait_until(lambda: not CardHold.objects.filter(node=node).exists(), what="cards freed")

    def waits_closed():
        shown = member_api.get(f"/api/training-jobs/{b['id']}").json()
        assert shown["state"] == "queued", shown  # never placed on A's Fleet
        return shown if (shown["waiting"] or {}).get("reason") == "fleet_closed" else None

    wait_until(waits_closed, what="B's job waiting fleet_closed")
    # A's next job is placed on the cards B's could not take, runs, and frees them again.
    again = submit(vic, project="cv", cards=8, script="echo a-again")
    wait_until(lambda: state_is(vic, again["id"], "succeeded"), what="A's next job")
    wait_until(lambda: not CardHold.objects.filter(node=node).exists(), what="cards freed")
    shown = waits_closed()
    assert shown is not None and shown["state"] == "queued", shown
    assert shown["waiting"]["numbers"] == {"gate": "visibility"}
    assert not Member.objects.filter(attempt__training_job_id=b["id"]).exists()
    read_by_b = json.dumps(shown)
    read_by_b += member_api.get(f"/api/training-jobs/{b['id']}/logs").content.decode()
    read_by_b += member_api.get("/api/training-jobs").content.decode()
    assert SECRET not in read_by_b, read_by_b
    assert '"cv"' not in read_by_b and "Vision" not in read_by_b
