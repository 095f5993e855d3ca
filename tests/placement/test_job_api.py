"""What a job on a node Fleet runs, through the API (DESIGN §7): every new field refused
with a 400 naming it and nothing written; state, attempts and members shown; cancel (R10)."""

import pytest

from audit.models import AuditEvent
from nodes.models import NodeCommand
from placement.models import LifecycleJob, TrainingJob
from placement.services.allocator import allocate
from tests.conftest import H100_DEVICE_INVENTORY

PATHS = [("training-jobs", {}), ("lifecycle-jobs", {"kind": "eval"})]


@pytest.fixture
def lab(make_fleet, gpu_node):
    fleet = make_fleet("gpu-lab", kind="node", capabilities=["train", "eval"])
    gpu_node(fleet)
    return fleet


def post(api, path, extra, **body):
    return api.post(f"/api/{path}", {"project": "ml", "name": "w", "cards": 1, **extra, **body})


BAD = [
    ({}, "command"),  # neither command nor script on a node Fleet
    ({"command": "python train.py"}, "command"),  # a string, not argv
    ({"command": ["python", 3]}, "command[1]"),
    ({"command": [""]}, "command"),
    ({"command": ["x"] * 65}, "command"),
    ({"command": ["python"], "script": "python"}, "script"),
    ({"script": 42}, "script"),
    ({"command": ["true"], "env": ["A=1"]}, "env"),
    ({"command": ["true"], "env": {"A": 1}}, "env.A"),
    ({"command": ["true"], "env": {"1A": "x"}}, "env.1A"),
    ({"command": ["true"], "env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env.CUDA_VISIBLE_DEVICES"),
    ({"command": ["true"], "env": {"TUNEPLANE_RANK": "0"}}, "env.TUNEPLANE_RANK"),
    ({"command": ["true"], "cpus": 0}, "cpus"),
    ({"command": ["true"], "cpus": "lots"}, "cpus"),
    ({"command": ["true"], "memory_bytes": 1024}, "memory_bytes"),
    ({"command": ["true"], "memory_bytes": 1.5}, "memory_bytes"),
    ({"command": ["true"], "max_attempts": 0}, "max_attempts"),
    ({"command": ["true"], "max_attempts": 11}, "max_attempts"),
    ({"command": ["true"], "image": "Not An Image"}, "image"),
    ({"image": "--privileged"}, "image"),  # never an option to the node's runtime
    ({"image": "busybox:1" + "a" * 250}, "image"),  # over 255 characters
    ({"image": 42}, "image"),
]


@pytest.mark.parametrize("path, extra", PATHS)
@pytest.mark.parametrize("body, field", BAD)
def test_bad_run_fields_are_a_400_naming_the_field_and_nothing_is_written(
    lab, member_api, path, extra, body, field
):
    events = AuditEvent.objects.count()
    response = post(member_api, path, extra, **body)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    named = error.get("field") or next(iter(error.get("fields", {})), "")
    assert named == field, error
    assert not TrainingJob.objects.exists() and not LifecycleJob.objects.exists()
    assert AuditEvent.objects.count() == events


@pytest.mark.parametrize("path, extra", PATHS)
def test_a_job_shows_its_run_fields_state_and_attempts(lab, member_api, path, extra):
    response = post(
        member_api,
        path,
        extra,
        command=["python", "train.py"],
        env={"SECRET_TOKEN": "s3cr3t"},
        cpus=2,
        memory_bytes=1 << 30,
        max_attempts=2,
    )
    assert response.status_code == 201, response.content
    job = response.json()
    assert (job["state"], job["attempts"], job["max_attempts"]) == ("queued", [], 2)
    assert job["env"] == ["SECRET_TOKEN"]  # names only: a value is not shown again
    assert "s3cr3t" not in response.content.decode()
    assert "s3cr3t" not in str(list(AuditEvent.objects.values_list("after", flat=True)))
    allocate(fleet_id=lab.id)
    listed = member_api.get(f"/api/{path}").json()["results"][0]
    (attempt,) = listed["attempts"]
    (member,) = attempt["members"]
    assert (listed["state"], attempt["number"], attempt["state"]) == ("starting", 1, "starting")
    assert member["cleanup"] == "pending" and member["node"]
    assert member["cards"][0]["uuid"] in {d["uuid"] for d in H100_DEVICE_INVENTORY["devices"]} | {
        f"{d['uuid']}-10.0.0.1:1" for d in H100_DEVICE_INVENTORY["devices"]
    }
    command = NodeCommand.objects.get(kind="start")
    assert command.payload["env"] == {"SECRET_TOKEN": "s3cr3t"}  # the node gets the value


@pytest.mark.parametrize("path, extra", PATHS)
def test_R10_cancel_a_queued_job_at_once_and_an_ended_one_is_a_conflict(
    lab, member_api, outsider_api, path, extra
):
    job = post(member_api, path, extra, command=["true"]).json()
    assert outsider_api.post(f"/api/{path}/{job['id']}/cancel").status_code == 404
    response = member_api.post(f"/api/{path}/{job['id']}/cancel")
    assert response.status_code == 200, response.content
    assert (response.json()["state"], response.json()["reason"]) == ("cancelled", "cancelled")
    again = member_api.post(f"/api/{path}/{job['id']}/cancel")
    assert again.status_code == 409 and again.json()["error"]["code"] == "job_ended"
    assert allocate(fleet_id=lab.id)["allocated"] == 0  # a cancelled job is not started


def test_R10_cancel_a_starting_job_sends_a_stop_to_its_member(lab, member_api):
    job = post(member_api, "training-jobs", {}, command=["sleep", "600"]).json()
    allocate(fleet_id=lab.id)
    response = member_api.post(f"/api/training-jobs/{job['id']}/cancel")
    assert response.status_code == 200
    assert response.json()["state"] == "starting" and response.json()["cancel_requested_at"]
    start = NodeCommand.objects.get(kind="start")
    stop = NodeCommand.objects.get(kind="stop")
    assert stop.payload == {"member": start.id, "grace_seconds": 30}
    member_api.post(f"/api/training-jobs/{job['id']}/cancel")  # asked twice: one stop
    assert NodeCommand.objects.filter(kind="stop").count() == 1


def test_R15_log_tails_are_rate_limited_per_user(member_api, admin_api, settings):
    """Each tail is read from a node over its stream: a user may ask for so many a minute
    (TUNEPLANE_LOGS_RATE); another user's budget is their own."""
    settings.TUNEPLANE_LOGS_RATE = "2/minute"
    paths = ["/api/training-jobs/999/logs", "/api/deployments/999/logs"]
    assert [member_api.get(path).status_code for path in paths] == [404, 404]
    refused = member_api.get("/api/training-jobs/999/logs")
    assert refused.status_code == 429 and int(refused["Retry-After"]) <= 60
    assert admin_api.get("/api/training-jobs/999/logs").status_code == 404
