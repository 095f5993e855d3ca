"""The operators' commands against a live console (issue 49): resume beside cordon and drain
(D1), uncordon on a draining node naming resume, remove (D2, D3), join-token (J2), quotas
shown and set (Q1); and cancel on a running job printing ``cancelling``, with --wait its
end (R10). Real HTTP, the test database; a member's node report is made as the gateway
would."""

import json
import threading
import time

import pytest
from django.db import connection

from audit.models import AuditEvent
from fleets.models import Fleet
from nodes.models import JoinToken, Node
from nodes.services.commands import Reported, node_command_report
from placement.models import Member, Quota, TrainingJob
from placement.services.allocator import allocate

from .conftest import tuneplane
from .test_commands import spec

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def lab(node_fleet, gpu_node):
    """gpu-lab, a node Fleet for train and serve, with one placeable 8-card node."""
    return node_fleet, gpu_node(node_fleet)


def test_D1_resume_undoes_a_drain_and_uncordon_on_a_draining_node_names_resume(
    lab, admin_user, member, signed_in
):
    _, node = lab
    signed_in(member)
    refused = tuneplane("resume", node.id)
    assert refused.exit_code == 1 and refused.stderr.startswith("error")
    signed_in(admin_user)
    drained = tuneplane("drain", node.id, "--reason", "rack 4")
    assert drained.stdout == f"node {node.id}: drained\n"
    uncordon = tuneplane("uncordon", node.id)
    assert uncordon.exit_code == 1, uncordon.output
    assert "resume" in uncordon.stderr and "drained" in uncordon.stderr
    resumed = tuneplane("resume", node.id)
    assert resumed.exit_code == 0 and resumed.stdout == f"node {node.id}: schedulable\n"
    assert AuditEvent.objects.filter(target_id=node.id, action="node.resumed").count() == 1


def test_D2_D3_remove_a_drained_node_and_a_gone_one_only_with_force(
    lab, admin_user, signed_in, gpu_node, node_fleet
):
    _, node = lab
    signed_in(admin_user)
    refused = tuneplane("remove", node.id)
    assert refused.exit_code == 1 and "drain first" in refused.stderr
    tuneplane("drain", node.id, "--reason", "retire")
    removed = tuneplane("remove", node.id)
    assert removed.exit_code == 0 and removed.stdout == f"node {node.id}: removed\n"
    gone = gpu_node(node_fleet, address="10.0.0.2:1")
    Node.objects.filter(pk=gone.pk).update(scheduling_state="gone")
    assert "force" in tuneplane("remove", gone.id).stderr
    forced = tuneplane("remove", gone.id, "--force")
    assert forced.exit_code == 0 and forced.stdout == f"node {gone.id}: removed\n"
    assert AuditEvent.objects.get(target_id=gone.id, action="node.removed").forced is True


def test_J2_join_token_is_minted_once_and_says_how_to_join(lab, admin_user, member, signed_in):
    minted_before = JoinToken.objects.count()  # the lab's node joined with one
    signed_in(member)
    assert tuneplane("join-token", "gpu-lab").exit_code == 1
    assert JoinToken.objects.count() == minted_before
    signed_in(admin_user)
    minted = tuneplane("join-token", "gpu-lab")
    assert minted.exit_code == 0, minted.output
    token = JoinToken.objects.latest("id")
    lines = minted.stdout.splitlines()
    assert lines[0] == f"join token {token.id} for Fleet gpu-lab"
    assert lines[1].startswith("token (shown once; expires ") and "tpj_" in lines[1]
    assert "tuneplane-node join" in minted.stdout and "--fleet gpu-lab" in minted.stdout
    as_json = json.loads(tuneplane("join-token", "gpu-lab", "-o", "json").stdout)
    assert as_json["fleet"] == "gpu-lab" and as_json["token"].startswith("tpj_")
    assert tuneplane("join-token", "no-such").exit_code == 1


def test_Q1_quotas_are_shown_and_set_from_a_file(
    lab, admin_user, member, signed_in, tmp_path, vision
):
    signed_in(admin_user)
    assert tuneplane("quotas", "gpu-lab").stdout == "no quotas: first come, first served\n"
    rows = tmp_path / "quotas.yaml"
    rows.write_text(
        "quotas:\n"
        "  - {project: ml, series: '', guaranteed: 4, limit: 8, weight: 2}\n"
        "  - {project: cv, series: '', guaranteed: 0, limit: null, weight: 1}\n"
    )
    set_ = tuneplane("quotas", "set", "gpu-lab", "-f", rows)
    assert set_.exit_code == 0, set_.output
    assert Quota.objects.count() == 2
    table = tuneplane("quotas", "gpu-lab").stdout
    ml = next(line for line in table.splitlines() if line.split()[:1] == ["ml"])
    assert ml.split()[:5] == ["ml", "any", "4", "8", "2"]
    assert "unlimited" in next(line for line in table.splitlines() if line.startswith("cv"))
    signed_in(member)  # a member reads their own projects' rows, and sets none
    mine = json.loads(tuneplane("quotas", "gpu-lab", "-o", "json").stdout)
    assert [row["project"] for row in mine["quotas"]] == ["ml"]
    refused = tuneplane("quotas", "set", "gpu-lab", "-f", rows)
    assert refused.exit_code == 1 and Quota.objects.count() == 2
    signed_in(admin_user)
    bad = tmp_path / "bad.yaml"
    bad.write_text("ml: 4\n")
    wrong = tuneplane("quotas", "set", "gpu-lab", "-f", bad)
    assert wrong.exit_code == 2 and "no list of quotas" in wrong.output
    bad.write_text("[]\n")
    assert tuneplane("quotas", "set", "gpu-lab", "-f", bad).exit_code == 0
    assert not Quota.objects.exists()


def running_job(member, signed_in, tmp_path) -> tuple[TrainingJob, Member]:
    signed_in(member)
    tuneplane("apply", "--wait", "0", "-f", spec(tmp_path, name="train", cards=2, script="true"))
    job = TrainingJob.objects.get()
    allocate(fleet_id=job.fleet_id)
    one = Member.objects.get(attempt__training_job=job)
    node_command_report(node_id=one.node_id, reported=Reported(one.command_id, "running"))
    assert TrainingJob.objects.get().state == "running"
    return job, one


def test_R10_cancel_on_a_running_job_prints_cancelling(lab, member, signed_in, tmp_path):
    job, _ = running_job(member, signed_in, tmp_path)
    cancelled = tuneplane("cancel", "training-job", job.pk)
    assert cancelled.exit_code == 0
    assert cancelled.stdout == f"training-job {job.pk}: cancelling\n"
    assert TrainingJob.objects.get().state == "running"  # until its member is stopped


def test_R10_cancel_wait_prints_the_end_once_the_member_is_stopped(
    lab, member, signed_in, tmp_path
):
    job, one = running_job(member, signed_in, tmp_path)

    def node_stops_it():
        try:
            deadline = time.monotonic() + 20
            while not TrainingJob.objects.get().cancel_requested_at:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            node_command_report(
                node_id=one.node_id, reported=Reported(one.command_id, "failed", -15, "stopped")
            )
        finally:
            connection.close()

    node = threading.Thread(target=node_stops_it)
    node.start()
    waited = tuneplane("cancel", "training-job", job.pk, "--wait")
    node.join(20)
    assert waited.exit_code == 0, waited.output
    assert waited.stdout == (
        f"training-job {job.pk}: cancelling\ntraining-job {job.pk}: cancelled (cancelled)\n"
    )
    # Already ended: said at once, nothing waited for.
    again = tuneplane("cancel", "training-job", job.pk, "--wait")
    assert again.exit_code == 1 and "nothing to cancel" in again.stderr


def test_R10_cancel_wait_gives_up_after_its_timeout(lab, member, signed_in, tmp_path):
    job, _ = running_job(member, signed_in, tmp_path)
    waited = tuneplane("cancel", "training-job", job.pk, "--wait", "--timeout", "0.5")
    assert waited.exit_code == 1
    assert waited.stdout == f"training-job {job.pk}: cancelling\n"
    assert "still running after 0.5 s" in waited.stderr


def test_F1_a_fleet_is_made_from_a_spec_file_and_listed_by_get(
    admin_user, member, signed_in, tmp_path
):
    """Issue 49: Fleets were curl only. `kind: fleet` in `apply -f` makes one (an
    administrator's; a member is refused), and `get fleets` lists it."""
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "kind: Fleet\nid: gpu-west\nfleet_kind: node\ndelivery: object-pull\n"
        "capabilities: [train, serve]\n"
    )
    signed_in(member)
    refused = tuneplane("apply", "-f", path)
    assert refused.exit_code == 1 and not Fleet.objects.filter(pk="gpu-west").exists()
    signed_in(admin_user)
    made = tuneplane("apply", "-f", path)
    assert made.exit_code == 0, made.stderr
    assert made.stdout.startswith("fleet gpu-west made (node, active)"), made.stdout
    assert sorted(Fleet.objects.get(pk="gpu-west").capabilities) == ["serve", "train"]
    listed = tuneplane("get", "fleets")
    assert listed.exit_code == 0 and "gpu-west" in listed.stdout
