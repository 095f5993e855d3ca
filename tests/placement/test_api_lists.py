"""Every list endpoint reads in as many queries for several rows as for one (STYLE.md), and a
deployment's Ready is one selector's answer wherever it is shown (L2).

The list contract itself is tests/api_contract.py's ListContract; a resource with a full
ApiResourceContract (Fleets) keeps it there, every other list here.
"""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.services import Actor, audit_record
from fleets.choices import FleetCapability
from nodes.choices import CommandKind, SchedulingState
from nodes.models import HardwareSeries, Node
from nodes.services import hardware
from nodes.services.commands import Reported, node_command_create, node_command_report
from nodes.services.control import node_report_inventory
from nodes.services.cordons import node_cordon
from nodes.services.drains import node_drain
from nodes.services.join import node_join
from nodes.services.sessions import session_open
from placement.choices import DeploymentState, LifecycleKind
from placement.models import Dataset, Deployment, Member, Revision, Volume
from placement.selectors import deployments_with_status, revisions_with_ready
from placement.services import episodes, serving, storage, submission
from placement.services.allocator import allocate
from tests.api_contract import ListContract, list_paths
from tests.conftest import H100_DEVICE_INVENTORY, SERVE, SYSTEM, make_csr
from tests.fleets import test_api as fleet_api_tests  # its TestFleetContract lists Fleets
from tests.tuneplane import test_projects_api  # noqa: F401  its TestProjectList lists projects

EVERY_CAPABILITY = list(FleetCapability)
RUN = {"argv": ["sleep", "600"]}


def _placeable(mint, fleet) -> Node:
    """Joined with a token, a live lease, inventory observed just now."""
    joined = node_join(
        token=mint(fleet)[1],
        fleet_id=fleet.id,
        csr=make_csr()[1],
        inventory=H100_DEVICE_INVENTORY,
        address="10.0.0.1:1",
    )
    session_open(node_id=joined.node.id, serial=joined.certificate.serial, gateway="test")
    return node_report_inventory(node_id=joined.node.id, inventory=H100_DEVICE_INVENTORY)


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
        node_command_create(actor=SYSTEM, node=node, kind=CommandKind.RUN, payload=RUN)
        node_drain(actor=SYSTEM, node=node, reason=f"leaving {n}")  # work left, by kind

    @pytest.fixture(autouse=True)
    def _fleet(self, make_fleet, mint):
        self.fleet, self.mint = make_fleet("lab", capabilities=EVERY_CAPABILITY), mint


class TestHardwareSeriesList(ListContract):
    list_path = "/api/hardware-series"
    list_reader = "member_api"

    def make_listed(self, n):
        series = hardware.series_create(actor=SYSTEM, slug=f"listed-{n}", name=f"Listed {n}")
        hardware.card_alias_add(actor=SYSTEM, name=f"Listed card {n}", series=series)


class TestCardNameList(ListContract):
    list_path = "/api/card-names"
    list_reader = "member_api"

    def make_listed(self, n):
        hardware.card_alias_add(
            actor=SYSTEM, name=f"Listed card {n}", series=HardwareSeries.objects.get(slug="h100")
        )


class TestJoinTokenList(ListContract):
    list_path = "/api/fleets/{fleet_id}/join-tokens"

    def list_url(self):
        return self.list_path.format(fleet_id=self.fleet.id)

    def make_listed(self, n):
        _placeable(self.mint, self.fleet)  # a used token: it names its node

    @pytest.fixture(autouse=True)
    def _fleet(self, make_fleet, mint):
        self.fleet, self.mint = make_fleet("lab", capabilities=[FleetCapability.TRAIN]), mint


class TestNodeCommandList(ListContract):
    list_path = "/api/nodes/{node_id}/commands"

    def list_url(self):
        return self.list_path.format(node_id=self.node.id)

    def make_listed(self, n):
        node_command_create(
            actor=SYSTEM, node=self.node, kind=CommandKind.RUN, payload={"argv": ["echo", str(n)]}
        )

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
                storage.storage_create(model, actor=self.actor, project="ml", name=name)


class TestTrainingJobList(WorkloadListContract):
    list_path = "/api/training-jobs"

    def make_listed(self, n):
        submission.training_job_submit(
            actor=self.actor,
            project="ml",
            name=f"job-{n}",
            command=["python", "train.py"],
            volumes=["ckpt", "logs"],
            datasets=["corpus", "evals"],
        )
        assert allocate(fleet_id=self.fleet.id)["allocated"] == 1  # listed with its attempt


class TestLifecycleJobList(WorkloadListContract):
    list_path = "/api/lifecycle-jobs"

    def make_listed(self, n):
        submission.lifecycle_job_submit(
            actor=self.actor,
            project="ml",
            name=f"eval-{n}",
            kind=LifecycleKind.EVAL,
            script="python eval.py",
            volumes=["ckpt"],
            datasets=["evals"],
        )
        assert allocate(fleet_id=self.fleet.id)["allocated"] == 1


class TestDeploymentList(WorkloadListContract):
    list_path = "/api/deployments"

    def make_listed(self, n):
        """Two replicas placed, and a second revision rolling out: listed with both."""
        deployment = submission.deployment_submit(
            actor=self.actor,
            project="ml",
            name=f"serve-{n}",
            fleet="lab",
            **{**SERVE, "port": 8000 + 2 * n, "replicas": 2},
        )
        assert allocate(fleet_id=self.fleet.id)["allocated"] == 2
        serving.revision_create(actor=self.actor, deployment=deployment, port=8001 + 2 * n)
        assert allocate(fleet_id=self.fleet.id)["allocated"] == 2


class TestPlaygroundSessionList(WorkloadListContract):
    list_path = "/api/playground-sessions"

    def make_listed(self, n):
        submission.playground_session_submit(
            actor=self.actor, project="ml", name=f"play-{n}", **{**SERVE, "port": 9000 + n}
        )
        assert allocate(fleet_id=self.fleet.id)["allocated"] == 1  # listed with its process


class TestEnvironmentList(WorkloadListContract):
    list_path = "/api/environments"

    def make_listed(self, n):
        submission.environment_submit(
            actor=self.actor, project="ml", name=f"env-{n}", manifest={"fleet": "lab"}
        )


class TestEpisodeList(WorkloadListContract):
    list_path = "/api/environments/{environment_id}/episodes"

    def list_url(self):
        return self.list_path.format(environment_id=self.environment.pk)

    def make_listed(self, n):
        if n == 0:
            self.environment = submission.environment_submit(
                actor=self.actor, project="ml", name="env", manifest={"fleet": "lab"}
            )
        episodes.episode_start(actor=self.actor, environment=self.environment, command=["true"])
        assert allocate(fleet_id=self.fleet.id)["allocated"] == 1  # listed with its node


class TestVolumeList(WorkloadListContract):
    list_path = "/api/volumes"

    def make_listed(self, n):
        storage.storage_create(Volume, actor=self.actor, project="ml", name=f"vol-{n}")


class TestDatasetList(WorkloadListContract):
    list_path = "/api/datasets"

    def make_listed(self, n):
        storage.storage_create(Dataset, actor=self.actor, project="ml", name=f"data-{n}")


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


# -- L2: one selector for Ready, wherever it is shown ----------------------------------


def _admin_status(client, deployment_id) -> tuple[str, list[str]]:
    """The status column of the admin list, and the Ready column of the change page."""
    listed = client.get("/admin/placement/deployment/").content.decode()
    row = re.search(rf'change/">{deployment_id}</a>.*?</tr>', listed, re.S).group(0)
    status = re.search(r'<td class="field-status">(\w+)</td>', row).group(1)
    page = client.get(f"/admin/placement/deployment/{deployment_id}/change/").content.decode()
    ready = re.findall(r'<td class="field-ready">\s*<p><img [^>]*alt="(\w+)"', page)
    assert f'<div class="readonly">{status}</div>' in page
    return status, ready


def test_L2_S1_api_and_admin_read_status_and_ready_from_one_selector(
    lab, member, member_api, admin_user, client
):
    deployment = submission.deployment_submit(
        actor=Actor.of_user(member), project="ml", name="serve", fleet="lab", **SERVE, replicas=2
    )
    allocate(fleet_id="lab")
    first, second = Member.objects.filter(revision__deployment=deployment).order_by("rank")
    for replica in (first, second):
        node_command_report(
            node_id=replica.node_id, reported=Reported(replica.command_id, "running", ready=True)
        )
    client.force_login(admin_user)

    def api():
        body = member_api.get(f"/api/deployments/{deployment.pk}").json()
        listed = member_api.get("/api/deployments").json()["results"]
        assert [item["status"] for item in listed] == [body["status"]]
        return body["status"], [revision["ready"] for revision in body["revisions"]]

    assert api() == ("ready", [True])
    assert _admin_status(client, deployment.pk) == ("ready", ["True"])
    Node.objects.filter(pk=second.node_id).update(quiet_serve=True)
    assert api() == ("degraded", [False])
    assert _admin_status(client, deployment.pk) == ("degraded", ["False"])
    Node.objects.filter(pk=second.node_id).update(
        quiet_serve=False, scheduling_state=SchedulingState.GONE
    )
    assert api() == ("degraded", [False])
    Node.objects.filter(pk=second.node_id).update(scheduling_state=SchedulingState.SCHEDULABLE)
    assert api() == ("ready", [True])
    assert _admin_status(client, deployment.pk) == ("ready", ["True"])
    Deployment.objects.filter(pk=deployment.pk).update(state=DeploymentState.STOPPED)
    assert api()[0] == "stopped" and _admin_status(client, deployment.pk)[0] == "stopped"


def test_L2_a_deployment_without_a_ready_revision_is_degraded(lab, member):
    actor = Actor.of_user(member)
    unplaced = submission.deployment_submit(
        actor=actor, project="ml", name="a", fleet="lab", **SERVE
    )
    empty = submission.deployment_submit(actor=actor, project="ml", name="b", fleet="lab", **SERVE)
    Revision.objects.filter(deployment=empty).delete()
    shown = deployments_with_status(Deployment.objects.all())
    assert {d.name: d.status for d in shown} == {"a": "degraded", "b": "degraded"}
    assert [r.ready for r in revisions_with_ready(unplaced.revisions.all())] == [False]


def test_admin_deployment_list_shows_status_in_queries_flat_in_rows(
    lab, member, admin_user, client
):
    client.force_login(admin_user)
    actor = Actor.of_user(member)

    def read(expected_rows):
        with CaptureQueriesContext(connection) as queries:
            page = client.get("/admin/placement/deployment/").content.decode()
        assert page.count('<td class="field-status">') == expected_rows
        return len(queries)

    submission.deployment_submit(actor=actor, project="ml", name="d0", fleet="lab", **SERVE)
    read(1)
    one = read(1)
    for n in range(1, 4):
        submission.deployment_submit(actor=actor, project="ml", name=f"d{n}", fleet="lab", **SERVE)
    assert read(4) == one


# -- a record's history (its audit events and its parts') -----------------------------


class HistoryListContract(WorkloadListContract):
    """A record's events: its own and its parts' (each event one row). The first call makes
    the record, placed, with its parts; each next one records one event on the record or on
    one of its parts, in turn, so both halves of the query are read with more rows."""

    def make_record(self):
        """The record, placed, and a part of it (a member) whose events it lists."""
        raise NotImplementedError

    def list_url(self):
        return re.sub(r"\{\w+\}", str(self.record.pk), self.list_path)

    def make_listed(self, n):
        if n == 0:
            self.record, self.part = self.make_record()
        target = self.part if n % 2 else self.record
        audit_record(actor=SYSTEM, action="history.noted", target=target, after={"n": n})


class TestTrainingJobEvents(HistoryListContract):
    list_path = "/api/training-jobs/{job_id}/events"

    def make_record(self):
        job = submission.training_job_submit(
            actor=self.actor, project="ml", name="job", command=["true"]
        )
        allocate(fleet_id=self.fleet.id)
        return job, Member.objects.get(attempt__training_job=job)


class TestDeploymentEvents(HistoryListContract):
    list_path = "/api/deployments/{deployment_id}/events"

    def make_record(self):
        deployment = submission.deployment_submit(
            actor=self.actor, project="ml", name="serve", fleet="lab", **SERVE
        )
        allocate(fleet_id=self.fleet.id)
        return deployment, Member.objects.get(revision__deployment=deployment)


class TestPlaygroundSessionEvents(HistoryListContract):
    list_path = "/api/playground-sessions/{session_id}/events"

    def make_record(self):
        session = submission.playground_session_submit(
            actor=self.actor, project="ml", name="play", **SERVE
        )
        allocate(fleet_id=self.fleet.id)
        return session, Member.objects.get(session=session)


class TestEpisodeEvents(HistoryListContract):
    list_path = "/api/environments/{environment_id}/episodes/{number}/events"

    def list_url(self):
        return self.list_path.format(
            environment_id=self.record.environment_id, number=self.record.number
        )

    def make_record(self):
        environment = submission.environment_submit(
            actor=self.actor, project="ml", name="env", manifest={"fleet": "lab"}
        )
        episode = episodes.episode_start(actor=self.actor, environment=environment, command=["x"])
        allocate(fleet_id=self.fleet.id)
        return episode, Member.objects.get(episode=episode)


class TestLifecycleJobEvents(HistoryListContract):
    list_path = "/api/lifecycle-jobs/{job_id}/events"

    def make_record(self):
        job = submission.lifecycle_job_submit(
            actor=self.actor, project="ml", name="eval", kind=LifecycleKind.EVAL, script="x"
        )
        allocate(fleet_id=self.fleet.id)
        return job, Member.objects.get(attempt__lifecycle_job=job)
