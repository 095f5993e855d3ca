"""What the A1 scenarios stand on (a World made on demand, the events a call must record)
and the arrangements of the writes outside nodes: each sets up what one call needs and
returns that call. The nodes' arrangements are in node_scenarios.py."""

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from django.test import TestCase

from audit.services import Actor
from fleets import services as fleets
from fleets.choices import FleetState
from nodes.models import Node, NodeCommand
from nodes.services import clusters as node_clusters
from nodes.services import commands, control, join, removal, sessions
from placement import handover as placement_clusters
from placement.services import serving, storage, submission
from tests.conftest import H100_DEVICE_INVENTORY, SERVE, SYSTEM, make_csr
from tests.nodes.kube_replay import KubeReplay
from tuneplane import services as tuneplane
from tuneplane.celery import app as celery_app

CREATED, CHANGED, DELETED = "created", "changed", "deleted"
RUN = {"argv": ["sleep", "600"]}
KUBE_TOKEN_ENV = "TUNEPLANE_TOKEN_TEST_KUBE_TOKEN"
RAYJOBS = "/apis/ray.io/v1/namespaces/ml-jobs/rayjobs"
RAYJOB = f"{RAYJOBS}/llama-sft-7b-x9k2p"


@dataclass(frozen=True)
class Event:
    """One event a call must record. ``change`` says which snapshots it must carry: a new
    record its ``after``, a changed one ``before`` and ``after``, a deleted one ``before``."""

    action: str
    change: str
    forced: bool = False


def created(action: str) -> Event:
    return Event(action, CREATED)


def changed(action: str, forced: bool = False) -> Event:
    return Event(action, CHANGED, forced)


def deleted(action: str) -> Event:
    return Event(action, DELETED)


@dataclass(frozen=True)
class Scenario:
    """``arrange`` sets up what the call needs and returns the call; ``events`` is what that
    one call must record: one per change, none for an observation."""

    arrange: Callable[["World"], Callable[[], object]]
    events: tuple[Event, ...]


class World:
    """What the scenarios stand on, made on demand: users, a node Fleet, its nodes, a
    kubernetes Fleet read from a replayed API server (no real one runs here)."""

    def __init__(self, *, admin, member, make_fleet, mint, monkeypatch, stack):
        self.admin, self.member = admin, member
        self.make_fleet, self.mint = make_fleet, mint
        self.monkeypatch, self.stack = monkeypatch, stack
        self._fleet = None

    def fleet(self):
        """A node Fleet (shared-mount, by F2) that can take every kind of work."""
        if self._fleet is None:
            self._fleet = self.make_fleet(
                "gpu-lab", kind="node", capabilities=["train", "eval", "serve", "env"]
            )
        return self._fleet

    def joined(self) -> join.JoinResult:
        fleet = self.fleet()
        return join.node_join(
            token=self.mint(fleet)[1],
            fleet_id=fleet.id,
            csr=make_csr()[1],
            inventory=H100_DEVICE_INVENTORY,
        )

    def node(self, state: str = "schedulable") -> Node:
        node = self.joined().node
        Node.objects.filter(pk=node.pk).update(scheduling_state=state)
        return Node.objects.get(pk=node.pk)

    def live(self):
        """An enrolled node with an open control session."""
        result = self.joined()
        return sessions.session_open(
            node_id=result.node.id, serial=result.certificate.serial, gateway="gw-1"
        )

    def placeable(self) -> Node:
        """A node that may take work now: a live lease, inventory observed just now (L1)."""
        return control.node_report_inventory(
            node_id=self.live().node_id, inventory=H100_DEVICE_INVENTORY
        )

    def command(self, node: Node, state: str = "pending") -> NodeCommand:
        made = commands.node_command_create(actor=SYSTEM, node=node, kind="run", payload=RUN)
        NodeCommand.objects.filter(pk=made.pk).update(state=state)
        return NodeCommand.objects.get(pk=made.pk)

    def kube(self):
        """A kubernetes Fleet whose manager answers from kube_responses/, read once."""
        for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
            self.monkeypatch.delenv(name, raising=False)
        self.monkeypatch.setenv(KUBE_TOKEN_ENV, "replay-token")
        replay = self.stack.enter_context(KubeReplay())
        replay.serve("GET", "/api/v1/nodes", "nodes.json")
        fleet = self.make_fleet(
            "k8s-lab",
            kind="kubernetes",
            capabilities=["train"],
            config={
                "kube_api_url": replay.url,
                "kube_token_env": KUBE_TOKEN_ENV,
                "kuberay_namespace": "ml-jobs",
            },
        )
        node_clusters.cluster_refresh(fleet)
        return fleet, replay

    def cluster_job(self, script: str = "python train.py"):
        """A training job admitted to the kubernetes Fleet and not handed over yet."""
        _, replay = self.kube()
        replay.serve("POST", RAYJOBS, "rayjob-created.json", status=201)
        job = submission.training_job_submit(
            actor=Actor.of_user(self.member), project="ml", name="sft", cards=1, script=script
        )
        return job, replay


@contextlib.contextmanager
def tasks_run_at_once():
    """Celery runs a task where it is sent, so what a dispatch leads to is seen here."""
    eager = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    try:
        yield
    finally:
        celery_app.conf.task_always_eager = eager


# -- arrangements: each sets up what one call needs and returns that call -----------------


def fleet_create(w):
    return lambda: fleets.fleet_create(actor=Actor.of_user(w.admin), id="new-lab", kind="node")


def fleet_update(w):
    fleet = w.fleet()
    return lambda: fleets.fleet_update(
        actor=Actor.of_user(w.admin), fleet=fleet, capabilities=["train"]
    )


def fleet_set_state(w):
    fleet = w.fleet()
    return lambda: fleets.fleet_set_state(
        actor=Actor.of_user(w.admin), fleet=fleet, state=FleetState.DRAINING
    )


def fleet_delete(w):
    fleet = w.make_fleet("empty-lab")
    return lambda: fleets.fleet_delete(actor=Actor.of_user(w.admin), fleet=fleet)


def fleet_delete_with_removed_nodes(w):
    """Its one node removed: the node is kept, detached, and the deletion says so (F7)."""
    node = w.node("drained")
    removal.node_remove(actor=SYSTEM, node=node)
    return lambda: fleets.fleet_delete(actor=Actor.of_user(w.admin), fleet=w.fleet())


def api_token_create(w):
    return lambda: tuneplane.api_token_create(actor=Actor.of_user(w.admin), user=w.member)


def api_token_revoke(w):
    token, _ = tuneplane.api_token_create(actor=SYSTEM, user=w.member)
    return lambda: tuneplane.api_token_revoke(actor=Actor.of_user(w.admin), token=token)


def project_create(w):
    return lambda: tuneplane.project_create(
        actor=Actor.of_user(w.admin), slug="vision", name="Vision"
    )


def project_update(w):
    project = tuneplane.project_create(actor=SYSTEM, slug="vision", name="Vision")
    return lambda: tuneplane.project_update(
        actor=Actor.of_user(w.admin), project=project, name="Computer vision"
    )


def project_delete(w):
    project = tuneplane.project_create(actor=SYSTEM, slug="vision", name="Vision")
    tuneplane.membership_add(actor=SYSTEM, project=project, user=w.member)
    return lambda: tuneplane.project_delete(actor=Actor.of_user(w.admin), project=project)


def membership_add(w):
    project = tuneplane.project_create(actor=SYSTEM, slug="vision", name="Vision")
    return lambda: tuneplane.membership_add(
        actor=Actor.of_user(w.admin), project=project, user=w.member
    )


def membership_remove(w):
    project = tuneplane.project_create(actor=SYSTEM, slug="vision", name="Vision")
    membership = tuneplane.membership_add(actor=SYSTEM, project=project, user=w.member)
    return lambda: tuneplane.membership_remove(actor=Actor.of_user(w.admin), membership=membership)


def login_locked_out(w):
    return lambda: tuneplane.login_locked_out(
        username=w.admin.get_username(), client="198.51.100.7", count=3
    )


def handover_on_commit(w):
    job, _ = w.cluster_job()

    def call():
        with tasks_run_at_once(), TestCase.captureOnCommitCallbacks(execute=True):
            placement_clusters.handover_on_commit(job)

    return call


def cluster_job_handover(w, script: str = "python train.py"):
    job, _ = w.cluster_job(script)
    return lambda: placement_clusters.cluster_job_handover(job.pk)


def cluster_job_handover_without_script(w):
    return cluster_job_handover(w, script="")


def cluster_jobs_track(w):
    """A job still waiting: handed over, then its state read back (RUNNING)."""
    _, replay = w.cluster_job()
    replay.serve("GET", RAYJOB, "rayjob-running.json")
    return placement_clusters.cluster_jobs_track


def submitted(submit, **fields):
    """A member's workload, with one placeable node in a Fleet that does every kind of work."""

    def arrange(w):
        w.placeable()
        return lambda: submit(actor=Actor.of_user(w.member), project="ml", **fields)

    return arrange


def deployment_update(w):
    w.placeable()
    deployment = submission.deployment_submit(
        actor=Actor.of_user(w.member), project="ml", name="chat", **SERVE
    )
    return lambda: serving.deployment_update(
        actor=Actor.of_user(w.admin), deployment=deployment, state="stopped"
    )


def storage_create(model):
    def arrange(w):
        return lambda: storage.storage_create(
            model, actor=Actor.of_user(w.member), project="ml", name="ckpt", uri="s3://ml/ckpt"
        )

    return arrange
