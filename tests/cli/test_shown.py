"""What the CLI shows a person (issue 49): a waiting item's place in its project's queue and
its Fleet's (Q8) in `get`'s table, a deployment's and a playground session's address, and
`events` one line each — when, what, by whom, the fields changed — with JSON's words rather
than Python's (`-o json` stays the API's body, for scripts)."""

import json

import pytest
from tuneplane_cli.kinds import kind_named, waiting
from tuneplane_cli.render import VALUE_WIDTH, event_line

from placement.models import TrainingJob
from placement.services.allocator import allocate

from .conftest import tuneplane
from .test_commands import spec


def column(kind: str, header: str, record: dict) -> str:
    read = dict(kind_named(kind).columns)[header]
    return str(read(record))


def test_Q8_a_waiting_item_says_its_place_in_its_projects_queue_and_its_fleets():
    wait = {
        "reason": "capacity",
        "message": "needs 8 h100; 3 free",
        "position_in_project": 1,
        "position_in_fleet": 2,
    }
    said = "capacity: needs 8 h100; 3 free (#1 in project, #2 in Fleet)"
    assert waiting({"waiting": wait}) == said
    assert column("training-jobs", "WAITING", {"waiting": wait}) == said
    revision = {"number": 1, "waiting": {"0": wait}}
    assert column("deployments", "WAITING", {"revisions": [revision]}) == f"replica 0 {said}"
    assert waiting({"waiting": None}) == "" and waiting({}) == ""
    unplaced = {**wait, "position_in_project": 0}  # not positioned: no place said
    assert waiting({"waiting": unplaced}) == "capacity: needs 8 h100; 3 free"


def test_S4_deployments_and_sessions_show_their_address():
    deployment = {"addresses": ["10.0.0.1:8000", "10.0.0.2:8000"]}
    assert column("deployments", "ADDRESS", deployment) == "10.0.0.1:8000,10.0.0.2:8000"
    assert column("playground-sessions", "ADDRESS", {"address": "10.0.0.1:8001"}) == (
        "10.0.0.1:8001"
    )
    assert column("playground-sessions", "ADDRESS", {"address": None}) == ""


def test_an_event_is_one_line_with_jsons_words_and_each_value_cut():
    event = {
        "at": "2026-12-07T19:25:04.123456Z",
        "action": "trainingjob.admitted",
        "target": {"type": "placement.trainingjob", "id": "7"},
        "actor": {"type": "user", "label": "mia"},
        "before": {"state": None, "preemptible": False, "same": 1},
        "after": {
            "state": "queued",
            "preemptible": True,
            "gates": ["visibility", "capability"],
            "fleet": {"id": "gpu-lab", "kind": "node"},
            "script": "x" * 200,
            "same": 1,
        },
        "forced": True,
    }
    line = event_line(event)
    assert "\n" not in line
    assert line.startswith(
        "2026-12-07 19:25:04  trainingjob.admitted  trainingjob 7  by mia (forced): "
    )
    assert "state: null → queued" in line and "preemptible: false → true" in line
    assert "gates: [visibility, capability]" in line and "fleet: {id=gpu-lab, kind=node}" in line
    assert "same" not in line and "False" not in line and "['" not in line
    assert f"script: {'x' * (VALUE_WIDTH - 1)}…" in line


@pytest.mark.django_db(transaction=True)
def test_Q8_get_and_events_through_the_cli(node_fleet, gpu_node, member, signed_in, tmp_path):
    gpu_node(node_fleet)
    signed_in(member)
    for name in ("first", "second", "third"):
        tuneplane("apply", "--wait", "0", "-f", spec(tmp_path, name=name, cards=8, script="true"))
    allocate(fleet_id=node_fleet.id)
    table = tuneplane("get", "training-jobs").stdout
    third = TrainingJob.objects.get(name="third")
    row = next(line for line in table.splitlines() if line.split()[:2] == [str(third.pk), "third"])
    assert "(#2 in project, #2 in Fleet)" in row
    lines = tuneplane("events", "training-job", third.pk).stdout.splitlines()
    assert lines[0].split("  ")[1:3] == ["trainingjob.admitted", f"trainingjob {third.pk}"]
    assert all("False" not in line and "None" not in line for line in lines)
    as_json = json.loads(tuneplane("events", "training-job", third.pk, "-o", "json").stdout)
    assert as_json["results"][0]["action"] == "trainingjob.admitted"
