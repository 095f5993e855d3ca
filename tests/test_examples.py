"""The examples shipped in examples/ for a machine without a GPU work together: the agent's
``--inventory-file`` reader accepts examples/inventory.json and lists each card by index and
UUID (Q9: what admission counts is what the allocator can hold, R1); examples/job.yaml,
read as ``tuneplane apply`` reads it, is admitted on a Fleet whose one node has that
inventory and is allocated both its cards; examples/train.sh runs and exits 0."""

import json
import subprocess
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from tuneplane_cli.spec import read_spec

from nodes.agent import inventory
from nodes.models import Node
from placement.models import Member, TrainingJob
from placement.services.allocator import allocate
from tests.conftest import placeable_node
from tests.docs.reference_hook import load

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def example_inventory() -> dict:
    return inventory.from_file(str(EXAMPLES / "inventory.json"))


def test_Q9_the_agent_reads_the_example_inventory_with_each_card_by_index_and_uuid():
    read = example_inventory()
    devices = read["devices"]
    assert [device["index"] for device in devices] == [0, 1]
    assert len({device["uuid"] for device in devices}) == 2
    assert all(device["name"] == "NVIDIA H100 80GB HBM3" for device in devices)
    # The counted cards are the listed devices, never more (Q9).
    assert (
        read["cards"]
        == inventory.cards_of(devices)
        == [{"name": "NVIDIA H100 80GB HBM3", "count": 2}]
    )
    assert read["cpu_budget"] >= 1 and read["memory_budget_bytes"] >= 2**30
    # A machine without GPUs cannot see a shared storage root either: it says so.
    assert read["storage_root_visible"] is False


def test_Q9_R1_the_example_job_runs_on_a_node_with_the_example_inventory(
    make_fleet, mint, member_api
):
    fleet = make_fleet("gpu-lab", delivery="object-pull", capabilities=["train", "serve", "env"])
    node = placeable_node(mint, fleet, example_inventory(), "10.0.0.1:1")
    assert Node.objects.get(pk=node.pk).scheduling_state == "schedulable"
    kind, body = read_spec(str(EXAMPLES / "job.yaml"))
    assert kind.name == "training-job"
    assert body["script"] == (EXAMPLES / "train.sh").read_text()
    response = member_api.post("/api/training-jobs", body)
    assert response.status_code == 201, response.content
    assert response.json()["fleet"] == "gpu-lab"
    assert allocate(fleet_id="gpu-lab")["allocated"] == 1
    job = TrainingJob.objects.get(pk=response.json()["id"])
    (member,) = Member.objects.filter(attempt__training_job=job)
    held = sorted(card["uuid"] for card in member.cards)
    assert held == sorted(device["uuid"] for device in example_inventory()["devices"])


def test_the_example_script_prints_and_exits_0(tmp_path):
    ran = subprocess.run(
        ["/bin/bash", str(EXAMPLES / "train.sh")],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "LR": "3e-4", "CUDA_VISIBLE_DEVICES": "0,1"},
    )
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert len(lines) >= 4 and lines[-1] == "train.sh: done"
    assert "CUDA_VISIBLE_DEVICES=0,1, LR=3e-4" in ran.stdout


SPEC_PATHS = {
    "training-job": "/api/training-jobs",
    "deployment": "/api/deployments",
    "playground-session": "/api/playground-sessions",
}


@pytest.mark.parametrize("name", ["job.yaml", "deployment.yaml", "playground-session.yaml"])
def test_each_example_spec_is_taken_whole_by_the_api_and_every_field_is_on_the_fields_page(
    name, make_fleet, mint, member_api
):
    """Issue 49: a session's fields were nowhere in the docs (`fleet` refused as unknown). Each
    example spec is read as `tuneplane apply` reads it and its dry run answered without a
    refusal of any field; every field it names is in the generated fields page's table."""
    fleet = make_fleet("gpu-lab", delivery="object-pull", capabilities=["train", "serve", "env"])
    placeable_node(mint, fleet, example_inventory(), "10.0.0.1:1")
    kind, body = read_spec(str(EXAMPLES / name))
    response = member_api.post(f"{SPEC_PATHS[kind.name]}?dry_run=true", body)
    assert response.status_code == 200, response.content
    assert response.json()["dry_run"] is True and response.json()["fleet"] == "gpu-lab"
    table = fields_table(kind.name)
    assert set(body) <= set(table), sorted(set(body) - set(table))


def fields_table(kind: str) -> set[str]:
    """The fields the docs' generated table lists for ``kind``."""
    rendered = load().render_fields(json.loads(openapi_json()))
    section = rendered.split(f"### {kind} ")[1].split("\n### ")[0]
    return {line.split("`")[1] for line in section.splitlines() if line.startswith("| `")}


def openapi_json() -> str:
    out = StringIO()
    call_command("spectacular", "--format", "openapi-json", stdout=out)
    return out.getvalue()
