"""What runs on a node, for its admin page (issue 49): each live member with what it runs for,
its project, cards and since when — none on an idle node, none of another node's, and one
query however many run there."""

from placement.node_page import node_members_section
from placement.services.allocator import allocate
from tests.placement.test_quotas import submit
from tests.placement.test_running_rules import members_of, report
from tests.placement.test_serving import deploy, replicas

RAN = "training job llama-finetune: attempt 1, rank 0"
SERVES = "deployment chat: replica 0"


def test_a_nodes_page_lists_its_running_job_and_serving_replica_and_no_other_nodes(
    node_fleet, gpu_node, member, django_assert_max_num_queries
):
    busy = gpu_node(node_fleet, address="10.0.0.1:1")
    idle = gpu_node(node_fleet, cards=1, address="10.0.0.2:1")
    job = submit(member, "ml", "llama-finetune", cards=4, series="h100")
    deployment = deploy(member, replicas=1, cards=2)
    allocate(fleet_id=node_fleet.id)
    [one] = members_of(job)
    report(one)
    [replica] = replicas(deployment)
    assert {one.node_id, replica.node_id} == {busy.id}

    with django_assert_max_num_queries(1):
        rows = node_members_section(busy)["rows"]
    shown = {row["owner"]: row for row in rows}
    assert set(shown) == {RAN, SERVES}
    ran = shown[RAN]
    assert (ran["project"], ran["cards"], ran["started"]) == ("ml", "0, 1, 2, 3", True)
    assert ran["url"] == f"/admin/placement/trainingjob/{job.pk}/change/"
    placed = shown[SERVES]
    assert placed["started"] is False and placed["since"] is not None  # placed, not yet started
    assert placed["url"] == f"/admin/placement/deployment/{deployment.pk}/change/"
    assert node_members_section(idle)["rows"] == []


def test_an_ended_member_no_longer_runs_there(node_fleet, gpu_node, member):
    node = gpu_node(node_fleet)
    job = submit(member, "ml", "short", cards=1)
    allocate(fleet_id=node_fleet.id)
    [one] = members_of(job)
    report(one)
    assert len(node_members_section(node)["rows"]) == 1
    report(one, "succeeded", exit_code=0)
    assert node_members_section(node)["rows"] == []
