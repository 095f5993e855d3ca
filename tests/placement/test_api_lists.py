"""Every list endpoint reads in as many queries for several rows as for one (STYLE.md).

The list contract itself is tests/api_contract.py's ListContract; a resource with a full
ApiResourceContract (Fleets) keeps it there, every other list here.
"""

import pytest

from audit.services import Actor
from nodes.models import Node
from nodes.services.commands import node_command_create
from nodes.services.control import node_report_inventory, session_open
from nodes.services.join import node_join
from nodes.services.scheduling import node_cordon
from placement import services
from placement.models import Dataset, Revision, Volume
from tests.api_contract import ListContract, list_paths
from tests.conftest import H100_INVENTORY, SYSTEM, make_csr
from tests.fleets import test_api as fleet_api_tests  # its TestFleetContract lists Fleets

EVERY_CAPABILITY = ["env", "eval", "serve", "train"]


def _placeable(mint, fleet) -> Node:
    """Joined with a token, a live lease, inventory observed just now."""
    joined = node_join(token=mint(fleet)[1], fleet_id=fleet.id, csr=make_csr()[1],
                       inventory=H100_INVENTORY, address="10.0.0.1:1")
    session_open(node_id=joined.node.id, serial=joined.certificate.serial, gateway="test")
    return node_report_inventory(node_id=joined.node.id, inventory=H100_INVENTORY)


@pytest.fixture
def lab(make_fleet, mint):
    """A node Fleet that does every kind of work, with two placeable nodes."""
    fleet = make_fleet("lab", capabilities=EVERY_CAPABILITY)
    return fleet, [_placeable(mint, fleet), _placeable(mint, fleet)]


# -- nodes, tokens, commands, audit ---------------------------------------------------

class TestNodeList(ListContract):
    list_path = "/api/nodes"

    def make_listed(self, n):
        node = _placeable(self.mint, self.fleet)
        node_cordon(actor=SYSTEM, node=node, reason=f"listed {n}")

    @pytest.fixture(autouse=True)
    def _fleet(self, make_fleet, mint):
        self.fleet, self.mint = make_fleet("lab", capabilities=EVERY_CAPABILITY), mint


class TestJoinTokenList(ListContract):
    list_path = "/api/fleets/{fleet_id}/join-tokens"

    def list_url(self):
        return self.list_path.format(fleet_id=self.fleet.id)

    def make_listed(self, n):
        _placeable(self.mint, self.fleet)  # a used token: it names its node

    @pytest.fixture(autouse=True)
    def _fleet(self, make_fleet, mint):
        self.fleet, self.mint = make_fleet("lab", capabilities=["train"]), mint


class TestNodeCommandList(ListContract):
    list_path = "/api/nodes/{node_id}/commands"

    def list_url(self):
        return self.list_path.format(node_id=self.node.id)

    def make_listed(self, n):
        node_command_create(actor=SYSTEM, node=self.node, kind="run",
                            payload={"argv": ["echo", str(n)]})

    @pytest.fixture(autouse=True)
    def _node(self, lab):
        self.node = lab[1][0]


class TestAuditList(ListContract):
    list_path = "/api/audit"

    def make_listed(self, n):
        self.make_fleet(f"audited-{n}")  # one fleet.created event


# -- workloads and storage ------------------------------------------------------------

class WorkloadListContract(ListContract):
    """Submitted by a member through the services the API calls, read by that member."""

    list_reader = "member_api"

    @pytest.fixture(autouse=True)
    def _lab(self, lab, member):
        self.fleet, self.nodes = lab
        self.actor = Actor.of_user(member)
        for model, names in ((Volume, ["ckpt", "logs"]), (Dataset, ["corpus", "evals"])):
            for name in names:
                services.storage_create(model, actor=self.actor, project="ml", name=name)


class TestTrainingJobList(WorkloadListContract):
    list_path = "/api/training-jobs"

    def make_listed(self, n):
        services.training_job_submit(actor=self.actor, project="ml", name=f"job-{n}",
                                     volumes=["ckpt", "logs"], datasets=["corpus", "evals"])


class TestLifecycleJobList(WorkloadListContract):
    list_path = "/api/lifecycle-jobs"

    def make_listed(self, n):
        services.lifecycle_job_submit(actor=self.actor, project="ml", name=f"eval-{n}",
                                      kind="eval", volumes=["ckpt"], datasets=["evals"])


class TestDeploymentList(WorkloadListContract):
    list_path = "/api/deployments"

    def make_listed(self, n):
        deployment = services.deployment_submit(actor=self.actor, project="ml",
                                                name=f"serve-{n}", fleet="lab")
        Revision.objects.create(deployment=deployment, number=2, node=self.nodes[1])


class TestPlaygroundSessionList(WorkloadListContract):
    list_path = "/api/playground-sessions"

    def make_listed(self, n):
        services.playground_session_submit(actor=self.actor, project="ml", name=f"play-{n}")


class TestEnvironmentList(WorkloadListContract):
    list_path = "/api/environments"

    def make_listed(self, n):
        services.environment_submit(actor=self.actor, project="ml", name=f"env-{n}",
                                    manifest={"fleet": "lab"})


class TestVolumeList(WorkloadListContract):
    list_path = "/api/volumes"

    def make_listed(self, n):
        services.storage_create(Volume, actor=self.actor, project="ml", name=f"vol-{n}")


class TestDatasetList(WorkloadListContract):
    list_path = "/api/datasets"

    def make_listed(self, n):
        services.storage_create(Dataset, actor=self.actor, project="ml", name=f"data-{n}")


def _contracts(base=ListContract):
    for contract in base.__subclasses__():
        yield contract
        yield from _contracts(contract)


def test_every_list_endpoint_keeps_the_list_contract(anon_api):
    assert fleet_api_tests.TestFleetContract in set(_contracts())
    schema = anon_api.get("/api/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    kept = {getattr(contract, "list_path", None) for contract in _contracts()}
    listed = list_paths(schema)
    assert {"/api/fleets", "/api/training-jobs", "/api/nodes/{node_id}/commands"} <= listed
    assert listed - kept == set(), "a list endpoint without a ListContract subclass"

