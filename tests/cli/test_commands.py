"""The CLI's commands against a live console (real HTTP, the test database): apply a spec
file and learn the Fleet and then where it runs or why it waits, or the refusal's reason;
get in a table or as the API's body; cancel; events; cordon and uncordon as an
administrator, and refused for anyone else. The allocator is run here, as its task would."""

import json
import threading
import time

import pytest
import yaml
from django.db import connection

from placement.models import TrainingJob
from placement.services.allocator import allocate

from .conftest import tuneplane

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def lab(node_fleet, gpu_node):
    """gpu-lab, a node Fleet for train and serve, with one placeable 8-card node."""
    return node_fleet, gpu_node(node_fleet)


def spec(tmp_path, **fields):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"kind": "training-job", "project": "ml", **fields}))
    return path


class Allocating:
    """The allocator's task, run until ``done`` (apply polls the job meanwhile)."""

    def __init__(self, fleet_id):
        self.fleet_id, self.done = fleet_id, threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self):
        try:
            while not self.done.wait(0.2):
                allocate(fleet_id=self.fleet_id)
        finally:
            connection.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join(10)


def test_apply_reads_its_script_file_and_prints_the_id_the_fleet_and_where_it_runs(
    lab, member, signed_in, tmp_path
):
    fleet, node = lab
    signed_in(member)
    (tmp_path / "train.sh").write_text("echo training\nexit 3\n")
    path = spec(tmp_path, name="train", cards=2, script={"file": "train.sh"})
    with Allocating(fleet.id):
        result = tuneplane("apply", "-f", path)
    assert result.exit_code == 0, result.output
    job = TrainingJob.objects.get()
    first, placed = result.stdout.splitlines()
    assert first == f"training-job {job.pk} admitted to Fleet gpu-lab"
    assert placed == f"runs on: {node.id}"
    assert job.script == "echo training\nexit 3"  # the file as read, as the API keeps it


def test_apply_says_why_work_waits(lab, member, signed_in, tmp_path):
    fleet, _ = lab
    signed_in(member)
    with Allocating(fleet.id):
        assert (
            tuneplane("apply", "-f", spec(tmp_path, name="a", cards=8, script="sleep 1")).exit_code
            == 0
        )
        waits = tuneplane("apply", "-f", spec(tmp_path, name="b", cards=8, script="sleep 1"))
    assert waits.exit_code == 0, waits.output
    waiting = TrainingJob.objects.get(name="b").waiting
    assert waits.stdout.splitlines()[-1] == (
        f"waits: {waiting['reason']}: {waiting['message']} (#1 in project, #1 in Fleet)"
    )
    table = tuneplane("get", "training-jobs")
    row = next(line for line in table.stdout.splitlines() if " b " in line)
    assert "queued" in row and "gpu-lab" in row and waiting["reason"] in row


def test_a_refusal_prints_its_reason_and_message_and_exits_non_zero(
    lab, member, signed_in, tmp_path
):
    signed_in(member)
    result = tuneplane("apply", "-f", spec(tmp_path, name="big", cards=64, script="true"))
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.startswith("refused (inventory_fit): ")
    assert not TrainingJob.objects.exists()


def test_a_spec_file_is_checked_before_anything_is_sent(member, signed_in, tmp_path):
    signed_in(member)
    path = tmp_path / "bad.yaml"
    path.write_text("kind: rocket\nname: x\n")
    result = tuneplane("apply", "-f", path)
    assert result.exit_code == 1 and "`kind: rocket` is not one of training-job" in result.stderr
    path.write_text("kind: training-job\nscript: {file: missing.sh}\n")
    missing = tuneplane("apply", "-f", path)
    assert (
        missing.exit_code == 1
        and "`script.file`" in missing.stderr
        and "missing.sh" in missing.stderr
    )
    path.write_text("kind: training-job\nproject: ml\nname: x\ncards: lots\n")
    invalid = tuneplane("apply", "-f", path)
    assert invalid.exit_code == 1 and invalid.stderr.startswith("error [cards]: line 4: ")
    assert "cards: " not in invalid.stderr.removeprefix("error [cards]: ")  # said once


def test_issue_49_every_error_of_a_spec_at_once_each_with_its_line_and_a_near_miss_named(
    member, signed_in, tmp_path
):
    """The review's: errors came one at a time and repeated the field (`error [card]: card:
    Unknown field`). Now a near-miss name, an unknown one and a bad value are told together,
    each with the line that holds it, nothing made."""
    signed_in(member)
    path = tmp_path / "typos.yaml"
    path.write_text(
        "kind: training-job\nproject: ml\nname: x\ncard: 2\nscript: 'true'\n"
        "retry:\n  on_exit_codes: [75]\n  max_atempts: 3\ncpus: many\nflavour: large\n"
    )
    result = tuneplane("apply", "-f", path)
    assert result.exit_code == 1, result.stdout
    lines = result.stderr.splitlines()
    assert lines[0] == "error: 4 fields refused; nothing was changed:", result.stderr
    said = "\n".join(lines[1:])
    assert '[card]: line 4: Unknown field; nothing was changed. Did you mean "cards"?' in said
    assert "[flavour]: line 10: Unknown field; nothing was changed." in said
    assert "Did you mean" not in said.split("[flavour]")[1].split("\n")[0]  # none near
    assert "[cpus]: line 9: " in said
    near = 'Did you mean "max_attempts"?'
    assert f"[retry.max_atempts]: line 8: Unknown field; nothing was changed. {near}" in said
    assert not TrainingJob.objects.exists()


def test_issue_49_a_job_with_neither_script_nor_command_is_told_so(
    lab, member, signed_in, tmp_path
):
    """A job on a node Fleet that says nothing to run is refused naming `command` and what
    would do (a command, a script or an image's own), not admitted to fail on its node."""
    signed_in(member)
    result = tuneplane("apply", "-f", spec(tmp_path, name="nothing", cards=1))
    assert result.exit_code == 1, result.stdout
    said = result.stderr
    assert "[command]" in said, said
    assert "runs a command (argv), a script or an image's default command" in said, said
    assert not TrainingJob.objects.exists()


def test_dry_run_prints_what_admission_would_decide_and_makes_nothing(
    lab, member, signed_in, tmp_path
):
    signed_in(member)
    result = tuneplane("apply", "--dry-run", "-f", spec(tmp_path, name="x", cards=2, script="true"))
    assert result.exit_code == 0, result.output
    said = result.stdout.splitlines()
    assert said[0] == "dry run: training-job would be admitted to Fleet gpu-lab"
    assert said[1] == "queue: position 1 in its project, 1 in the Fleet"
    assert said[2] == f"would run on: {lab[1].id}"  # the allocator's next pass, previewed
    assert not TrainingJob.objects.exists()


def test_get_answers_a_table_or_exactly_the_apis_body(lab, member, member_api, signed_in, tmp_path):
    signed_in(member)
    tuneplane("apply", "--wait", "0", "-f", spec(tmp_path, name="train", cards=2, script="true"))
    job = TrainingJob.objects.get()
    table = tuneplane("get", "training-jobs")
    header, row = [line for line in table.stdout.splitlines() if line.strip()][:3:2]
    for column in ("ID", "STATE", "FLEET", "CARDS", "AGE", "WAITING"):
        assert column in header
    assert row.split()[:6] == [str(job.pk), "train", "ml", "queued", "gpu-lab", "2"]
    as_json = tuneplane("get", "training-job", job.pk, "-o", "json")
    assert json.loads(as_json.stdout) == member_api.get(f"/api/training-jobs/{job.pk}").json()
    listed = tuneplane("get", "training-jobs", "-o", "json")
    assert json.loads(listed.stdout) == member_api.get("/api/training-jobs").json()
    as_yaml = tuneplane("get", "training-job", job.pk, "-o", "yaml")
    assert yaml.safe_load(as_yaml.stdout)["id"] == job.pk
    missing = tuneplane("get", "training-job", 99999)
    assert missing.exit_code == 1 and missing.stderr == "error: Training job 99999 not found.\n"
    unknown = tuneplane("get", "rockets")
    assert unknown.exit_code == 2 and "training-jobs" in unknown.output


def test_cancel_and_events(lab, member, signed_in, tmp_path):
    signed_in(member)
    tuneplane("apply", "--wait", "0", "-f", spec(tmp_path, name="train", cards=2, script="true"))
    job = TrainingJob.objects.get()
    cancelled = tuneplane("cancel", "training-job", job.pk)
    assert cancelled.exit_code == 0 and cancelled.stdout == f"training-job {job.pk}: cancelled\n"
    again = tuneplane("cancel", "training-job", job.pk)
    assert again.exit_code == 1 and again.stderr.startswith("error")
    events = tuneplane("events", "training-jobs", job.pk)
    assert events.exit_code == 0, events.output
    lines = events.stdout.splitlines()
    admitted = next(i for i, line in enumerate(lines) if "trainingjob.admitted" in line)
    cancelled_at = next(i for i, line in enumerate(lines) if "trainingjob.cancelled" in line)
    assert admitted < cancelled_at and "mia" in lines[admitted]
    assert "state: queued → cancelled" in lines[cancelled_at]
    as_json = json.loads(tuneplane("events", "training-job", job.pk, "-o", "json").stdout)
    assert [e["action"] for e in as_json["results"]][0] == "trainingjob.admitted"


def test_cordon_and_uncordon_as_an_administrator_and_refused_to_anyone_else(
    lab, admin_user, member, signed_in
):
    _, node = lab
    signed_in(member)
    refused = tuneplane("cordon", node.id, "--reason", "disk")
    assert refused.exit_code == 1 and refused.stderr.startswith("error")
    signed_in(admin_user)
    cordoned = tuneplane("cordon", node.id, "--reason", "disk")
    assert cordoned.exit_code == 0 and cordoned.stdout == f"node {node.id}: cordoned\n"
    row = next(line for line in tuneplane("get", "nodes").stdout.splitlines() if node.id in line)
    assert "cordoned" in row
    uncordoned = tuneplane("uncordon", node.id)
    assert uncordoned.exit_code == 0 and uncordoned.stdout == f"node {node.id}: schedulable\n"
    drained = tuneplane(
        "drain", node.id, "--reason", "retire", "--deadline", "2030-01-01T00:00:00Z"
    )
    assert drained.exit_code == 0 and drained.stdout.startswith(f"node {node.id}: drain")


def test_logs_of_a_member_whose_node_is_not_connected_print_the_apis_message(
    lab, member, signed_in, tmp_path
):
    fleet, node = lab
    signed_in(member)
    with Allocating(fleet.id):
        tuneplane("apply", "-f", spec(tmp_path, name="train", cards=2, script="true"))
    node.sessions.update(closed_at=node.created_at)
    job = TrainingJob.objects.get()
    result = tuneplane("logs", "training-job", job.pk)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: Node '{node.id}' is not connected")
    started = time.monotonic()
    assert tuneplane("logs", "episode", "7").exit_code == 2  # not ENV/NUMBER: a usage error
    assert time.monotonic() - started < 5


def test_Q7_a_dry_run_says_whom_it_would_preempt_by_name():
    from tuneplane_cli.main import _previewed

    said = _previewed(
        {
            "starts": False,
            "nodes": [],
            "waiting": {"reason": "preempting", "message": "preempting 1 job(s)"},
            "preempts": [{"job": "trainingjob-3", "deadline": "2026-12-07T07:00:00+00:00"}],
        }
    )
    assert said == "would wait: preempting: preempting 1 job(s) (preempting trainingjob-3)"
    assert _previewed({"starts": True, "nodes": ["n-1"]}) == "would run on: n-1"
