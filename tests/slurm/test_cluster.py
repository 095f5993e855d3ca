"""The session's Slurm cluster is real: JWT auth, four H100s in its gres, jobs that run."""

import json
import time
import urllib.error
import urllib.request

import pytest

pytestmark = pytest.mark.slurm

API = "/slurm/v0.0.38"


def call(cluster, method, path, *, headers=None, body=None):
    """``(status, body)`` of one request to slurmrestd; a JSON body decoded, else its text."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **(headers or {})}
    request = urllib.request.Request(cluster.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def test_the_node_has_four_h100s(slurm_cluster):
    status, body = call(slurm_cluster, "GET", f"{API}/nodes", headers=slurm_cluster.headers)

    assert status == 200, body
    assert body["errors"] == []
    [node] = body["nodes"]
    assert node["name"] == slurm_cluster.node_name
    assert node["gres"] == "gpu:h100:4"
    assert node["partitions"] == [slurm_cluster.partition]


def test_no_credentials_are_refused_with_401(slurm_cluster):
    status, body = call(slurm_cluster, "GET", f"{API}/nodes")

    assert (status, body) == (401, "Authentication failure")


def test_a_bad_token_is_a_500_with_errors(slurm_cluster):
    headers = {**slurm_cluster.headers, "X-SLURM-USER-TOKEN": "not-a-token"}

    status, body = call(slurm_cluster, "GET", f"{API}/nodes", headers=headers)

    assert status == 500
    assert body["errors"][0]["error"] == "Unspecified error"
    assert not body.get("nodes")


def test_a_submitted_job_runs_to_completion(slurm_cluster, tmp_path):
    submission = {
        "script": "#!/bin/sh\nsleep 1",
        "job": {
            "current_working_directory": str(tmp_path),
            "environment": {"PATH": "/bin:/usr/bin"},
        },
    }

    status, body = call(
        slurm_cluster, "POST", f"{API}/job/submit", headers=slurm_cluster.headers, body=submission
    )

    assert status == 200 and body["errors"] == [], body
    assert final_state(slurm_cluster, body["job_id"]) == "COMPLETED"


def final_state(cluster, job_id, timeout=30.0):
    """The job's state once it has left PENDING and RUNNING."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, body = call(cluster, "GET", f"{API}/job/{job_id}", headers=cluster.headers)
        assert status == 200, body
        state = body["jobs"][0]["job_state"]
        if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return state
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} still {state} after {timeout:.0f} s")
