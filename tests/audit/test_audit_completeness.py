"""A1: every service function that writes records one audit event per change it makes.

The writers are found, not listed by hand: every public function of the modules that record
audit events (WRITING_MODULES). Each one is in SCENARIOS (set up, called once, its new events
checked: who, what, which target, before and after), in NOT_AUDITED (with the reason its own
docstring gives), or in READS (it writes nothing). A new public function in those modules
fails the classification test until it is placed; a module that starts recording audit events
fails until it is listed. The other half of A1 — events are never edited or deleted — is
tests/audit/test_audit.py.
"""

import contextlib
import importlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import TestCase
from django.utils import timezone

from audit.models import AuditEvent
from fleets import services as fleets
from nodes import clusters as node_clusters
from nodes import commands, control, liveness, scheduling
from nodes import services as nodes
from nodes.commands import Reported
from nodes.models import (CardAlias, ClusterSnapshot, ControlSession, GatewayReplica,
                          HardwareSeries, Node, NodeCommand, NodeCordon, quiet_threshold)
from placement import clusters as placement_clusters
from placement import services as placement
from placement.models import Dataset, Volume
from tests.conftest import H100_INVENTORY, SYSTEM, make_csr
from tests.nodes.kube_replay import KubeReplay
from tuneplane import services as tuneplane
from tuneplane.celery import app as celery_app

ROOT = Path(__file__).resolve().parents[2]
APPS = ("tuneplane", "audit", "fleets", "nodes", "placement")
WRITING_MODULES = (
    "fleets.services", "tuneplane.services", "nodes.services", "nodes.control",
    "nodes.commands", "nodes.scheduling", "nodes.liveness", "nodes.clusters",
    "placement.services", "placement.clusters",
)
# What a module that records audit events says: the audit services, or the table itself.
RECORDS_AUDIT = re.compile(r"audit_record|audit_auditevent")

READS = {
    "nodes.services.join_commands",  # formats the one-liners shown at mint
    "nodes.commands.checked",  # validates a node's report
    "nodes.liveness.gone_threshold",  # a pure computation (L4)
    "nodes.liveness.console_hearing",  # reads the gateway replicas
    "nodes.control.replica_gone_after",  # a pure computation
    "placement.services.project_for",  # reads the project and the membership
    "placement.services.live_deployments_blocking_deletion",  # F7's check, a count
    "placement.services.workload_records_blocking_deletion",  # F7's check, counts
    "fleets.services.fleet_hold",  # a row lock against deletion, taken before a join
}
# Writes that are observations, not changes, in their own (or their module's) words.
NOT_AUDITED = {
    "nodes.control.leases_renew": "audited where it changes what an operator sees — except "
                                  "heartbeats, which only renew a lease",
    "nodes.control.gateway_alive": "Still listening: an observation, every few seconds, "
                                   "not audited (like a lease).",
    "nodes.services.card_names_remember": "An observation, not audited: the mapping an admin "
                                          "makes of it is.",
}

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
            self._fleet = self.make_fleet("gpu-lab", kind="node",
                                          capabilities=["train", "eval", "serve", "env"])
        return self._fleet

    def joined(self) -> nodes.JoinResult:
        fleet = self.fleet()
        return nodes.node_join(token=self.mint(fleet)[1], fleet_id=fleet.id,
                               csr=make_csr()[1], inventory=H100_INVENTORY)

    def node(self, state: str = "schedulable") -> Node:
        node = self.joined().node
        Node.objects.filter(pk=node.pk).update(scheduling_state=state)
        return Node.objects.get(pk=node.pk)

    def live(self):
        """An enrolled node with an open control session."""
        result = self.joined()
        return control.session_open(node_id=result.node.id, serial=result.certificate.serial,
                                    gateway="gw-1")

    def placeable(self) -> Node:
        """A node that may take work now: a live lease, inventory observed just now (L1)."""
        return control.node_report_inventory(node_id=self.live().node_id,
                                             inventory=H100_INVENTORY)

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
        fleet = self.make_fleet("k8s-lab", kind="kubernetes", capabilities=["train"], config={
            "kube_api_url": replay.url, "kube_token_env": KUBE_TOKEN_ENV,
            "kuberay_namespace": "ml-jobs"})
        node_clusters.cluster_refresh(fleet)
        return fleet, replay

    def cluster_job(self, script: str = "python train.py"):
        """A training job admitted to the kubernetes Fleet and not handed over yet."""
        _, replay = self.kube()
        replay.serve("POST", RAYJOBS, "rayjob-created.json", status=201)
        job = placement.training_job_submit(actor=self.member, project="ml", name="sft",
                                            cards=1, script=script)
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
    return lambda: fleets.fleet_create(actor=w.admin, id="new-lab", kind="node")


def fleet_update(w):
    fleet = w.fleet()
    return lambda: fleets.fleet_update(actor=w.admin, fleet=fleet, capabilities=["train"])


def fleet_set_state(w):
    fleet = w.fleet()
    return lambda: fleets.fleet_set_state(actor=w.admin, fleet=fleet, state="draining")


def fleet_delete(w):
    fleet = w.make_fleet("empty-lab")
    return lambda: fleets.fleet_delete(actor=w.admin, fleet=fleet)


def api_token_create(w):
    return lambda: tuneplane.api_token_create(actor=w.admin, user=w.member)


def api_token_revoke(w):
    token, _ = tuneplane.api_token_create(actor=SYSTEM, user=w.member)
    return lambda: tuneplane.api_token_revoke(actor=w.admin, token=token)


def join_token_mint(w):
    fleet = w.fleet()
    return lambda: nodes.join_token_mint(actor=w.admin, fleet=fleet)


def join_token_revoke(w):
    token, _ = w.mint(w.fleet())
    return lambda: nodes.join_token_revoke(actor=w.admin, token=token)


def node_join(w, token: str = ""):
    fleet = w.fleet()
    token = token or w.mint(fleet)[1]
    return lambda: nodes.node_join(token=token, fleet_id=fleet.id, csr=make_csr()[1],
                                   inventory=H100_INVENTORY)


def node_join_refused(w):
    join = node_join(w, token="not-a-token")

    def call():
        with pytest.raises(nodes.JoinRefused):
            join()
    return call


def card_alias_map(w):
    alias = CardAlias.objects.create(name="Mystery X1")
    series = HardwareSeries.objects.get(slug="h100")
    return lambda: nodes.card_alias_map(actor=w.admin, alias=alias, series=series)


def session_open(w):
    result = w.joined()
    return lambda: control.session_open(node_id=result.node.id,
                                        serial=result.certificate.serial, gateway="gw-1")


def session_open_replacing(w):
    session = w.live()
    serial = session.node.credentials.get().serial
    return lambda: control.session_open(node_id=session.node_id, serial=serial,
                                        gateway="gw-2")


def session_close(w):
    session = w.live()
    return lambda: control.session_close(session_id=session.id, reason="stream ended")


def credential_rotate(w):
    result = w.joined()
    return lambda: control.credential_rotate(node_id=result.node.id,
                                             serial=result.certificate.serial,
                                             csr=make_csr()[1])


def node_report_inventory(w):
    session = w.live()
    return lambda: control.node_report_inventory(node_id=session.node_id,
                                                 inventory=H100_INVENTORY)


def node_report_inventory_unchanged(w):
    node = w.placeable()
    return lambda: control.node_report_inventory(node_id=node.id, inventory=H100_INVENTORY)


def gateway_started(w):
    return lambda: control.gateway_started(name="gw-1")


def gateway_started_again(w):
    an_hour_ago = timezone.now() - timedelta(hours=1)
    GatewayReplica.objects.create(name="gw-1", started_at=an_hour_ago, seen_at=an_hour_ago)
    return lambda: control.gateway_started(name="gw-1")


def gateway_started_with_sessions_left_open(w):
    session = w.live()  # on gw-1, whose process was then killed
    return lambda: control.gateway_started(name="gw-1",
                                           serving_since=session.opened_at + timedelta(1))


def sessions_of_silent_replicas_close(w):
    session = w.live()  # on gw-1, killed an hour ago and not started again
    an_hour_ago = timezone.now() - timedelta(hours=1)
    GatewayReplica.objects.create(name="gw-1", started_at=an_hour_ago, seen_at=an_hour_ago)
    ControlSession.objects.filter(pk=session.pk).update(lease_expires_at=an_hour_ago)
    return lambda: control.sessions_of_silent_replicas_close(listening_since=an_hour_ago)


def gateway_alive(w):
    replica = control.gateway_started(name="gw-1")
    return lambda: control.gateway_alive(name="gw-1", started_at=replica.started_at)


def card_names_remember(w):
    return lambda: nodes.card_names_remember(["Mystery Accelerator Z"], timezone.now())


def leases_renew(w):
    session = w.live()
    return lambda: control.leases_renew({str(session.id): timezone.now()})


def node_command_create(w):
    node = w.node()
    return lambda: commands.node_command_create(actor=w.admin, node=node, kind="run",
                                                payload=RUN)


def node_command_report(w, command_id: str = "", reported: Reported | None = None):
    node = w.node()
    command = w.command(node)
    return lambda: commands.node_command_report(
        node_id=node.id, reported=reported or Reported(command_id or command.id, "running"))


def node_command_report_stray(w):
    return node_command_report(w, command_id="c-stray")


def node_command_report_stray_again(w):
    node = w.node()
    commands.node_command_report(node_id=node.id, reported=Reported("c-stray", "running"))
    return lambda: commands.node_command_report(node_id=node.id,
                                                reported=Reported("c-stray", "failed", 3))


def node_command_report_last_of_a_drain(w):
    node = w.node("draining")
    command = w.command(node, "running")
    return lambda: commands.node_command_report(node_id=node.id,
                                                reported=Reported(command.id, "succeeded", 0))


def node_commands_reconcile(w):
    """Finished offline, forgotten by the node, still running (no change), and a stray."""
    node = w.node()
    finished, forgotten, running = (w.command(node, "running") for _ in range(3))
    report = [Reported(finished.id, "failed", 3), Reported(running.id, "running"),
              Reported("c-stray", "running")]
    return lambda: commands.node_commands_reconcile(node_id=node.id, reported=report)


def node_observe_storage_root(w, visible: bool = False):
    node = w.node()
    if visible:
        NodeCordon.objects.create(node=node, source="storage", created_at=timezone.now(),
                                  reason=scheduling.STORAGE_LOST)
    return lambda: scheduling.node_observe_storage_root(node_id=node.id, visible=visible)


def node_observe_storage_root_back(w):
    return node_observe_storage_root(w, visible=True)


def node_cordon(w):
    node = w.node()
    return lambda: scheduling.node_cordon(actor=w.admin, node=node, reason="fan noise")


def node_cordon_new_reason(w):
    node = w.node()
    scheduling.node_cordon(actor=w.admin, node=node, reason="fan noise")
    return lambda: scheduling.node_cordon(actor=w.admin, node=node, reason="fan replaced")


def node_uncordon(w):
    node = w.node()
    scheduling.node_cordon(actor=w.admin, node=node, reason="fan noise")
    return lambda: scheduling.node_uncordon(actor=w.admin, node=node)


def node_drain(w):
    node = w.node()
    return lambda: scheduling.node_drain(actor=w.admin, node=node)


def node_drain_settle(w):
    node = w.node("draining")
    return lambda: scheduling.node_drain_settle(node_id=node.id)


def node_remove(w, state: str = "drained", force: bool = False):
    node = w.node(state)
    return lambda: scheduling.node_remove(actor=w.admin, node=node, force=force)


def node_remove_forced(w):
    return node_remove(w, state="gone", force=True)


def storage_cordon_sweep(w):
    """One node lost its storage root unseen by the gateway; another's came back."""
    lost, back = w.node(), w.node()
    Node.objects.filter(pk=lost.pk).update(inventory={**H100_INVENTORY,
                                                      "storage_root_visible": False})
    NodeCordon.objects.create(node=back, source="storage", created_at=timezone.now(),
                              reason=scheduling.STORAGE_LOST)
    return scheduling.storage_cordon_sweep


def liveness_sweep(w):
    """A gateway listening all day; one node silent past every threshold (quiet for train
    and serve, then gone), one back after it was quiet for serve (answering again)."""
    now = timezone.now()
    GatewayReplica.objects.create(name="gw-1", started_at=now - timedelta(days=1),
                                  seen_at=now + timedelta(days=1))
    fleet = w.make_fleet("sweep-lab", kind="node", capabilities=["train", "serve"])
    silent = now - quiet_threshold("train") - timedelta(minutes=1)
    Node.objects.create(fleet=fleet, scheduling_state="schedulable", inventory=H100_INVENTORY,
                        last_seen_at=silent, inventory_observed_at=silent)
    Node.objects.create(fleet=fleet, scheduling_state="schedulable", inventory=H100_INVENTORY,
                        last_seen_at=now, inventory_observed_at=now, quiet_serve=True)
    return lambda: liveness.liveness_sweep(now=now)


def cluster_refresh(w):
    fleet, _ = w.kube()
    return lambda: node_clusters.cluster_refresh(fleet)


def cluster_refresh_unreachable(w):
    fleet, replay = w.kube()
    replay.serve("GET", "/api/v1/nodes", "status-500.json", status=500)
    return lambda: node_clusters.cluster_refresh(fleet)


def cluster_refresh_reachable_again(w):
    fleet, _ = w.kube()
    ClusterSnapshot.objects.filter(fleet=fleet).update(error="HTTP 500",
                                                       error_since=timezone.now())
    return lambda: node_clusters.cluster_refresh(fleet)


def clusters_refresh(w):
    cluster_refresh_unreachable(w)
    return node_clusters.clusters_refresh


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
        return lambda: submit(actor=w.member, project="ml", **fields)
    return arrange


def deployment_update(w):
    w.placeable()
    deployment = placement.deployment_submit(actor=w.member, project="ml", name="chat")
    return lambda: placement.deployment_update(actor=w.admin, deployment=deployment,
                                               state="stopped")


def storage_create(model):
    def arrange(w):
        return lambda: placement.storage_create(model, actor=w.member, project="ml",
                                                name="ckpt", uri="s3://ml/ckpt")
    return arrange


# Named "module.function", or "module.function/case" for a further case of one function.
SCENARIOS = {
    "fleets.services.fleet_create": Scenario(fleet_create, (created("fleet.created"),)),
    "fleets.services.fleet_update": Scenario(fleet_update, (changed("fleet.updated"),)),
    "fleets.services.fleet_set_state": Scenario(fleet_set_state,
                                                (changed("fleet.state_changed"),)),
    "fleets.services.fleet_delete": Scenario(fleet_delete, (deleted("fleet.deleted"),)),
    "tuneplane.services.api_token_create": Scenario(api_token_create,
                                                    (created("api_token.created"),)),
    "tuneplane.services.api_token_revoke": Scenario(api_token_revoke,
                                                    (changed("api_token.revoked"),)),
    "nodes.services.join_token_mint": Scenario(join_token_mint,
                                               (created("join_token.minted"),)),
    "nodes.services.join_token_revoke": Scenario(join_token_revoke,
                                                 (changed("join_token.revoked"),)),
    "nodes.services.node_join": Scenario(node_join, (created("node.joined"),)),
    "nodes.services.node_join/refused": Scenario(node_join_refused,
                                                 (created("node.join_refused"),)),
    "nodes.services.card_alias_map": Scenario(card_alias_map, (changed("card_alias.mapped"),)),
    "nodes.control.session_open": Scenario(session_open, (created("control_session.opened"),)),
    # "a newer stream replaces an older one (its session is closed)": two sessions change.
    "nodes.control.session_open/replacing-a-stream": Scenario(session_open_replacing, (
        changed("control_session.closed"), created("control_session.opened"))),
    "nodes.control.session_close": Scenario(session_close, (changed("control_session.closed"),)),
    "nodes.control.credential_rotate": Scenario(credential_rotate,
                                                (changed("node.credential_rotated"),)),
    # The first report on a live session makes an enrolled node schedulable.
    "nodes.control.node_report_inventory": Scenario(node_report_inventory,
                                                    (changed("node.inventory_reported"),)),
    "nodes.control.node_report_inventory/unchanged": Scenario(node_report_inventory_unchanged,
                                                              ()),
    "nodes.control.gateway_started": Scenario(gateway_started, (created("gateway.started"),)),
    "nodes.control.gateway_started/restart": Scenario(gateway_started_again,
                                                      (changed("gateway.started"),)),
    "nodes.control.gateway_started/sessions-left-open": Scenario(
        gateway_started_with_sessions_left_open,
        (created("gateway.started"), changed("control_session.closed"))),
    "nodes.control.sessions_of_silent_replicas_close": Scenario(
        sessions_of_silent_replicas_close, (changed("control_session.closed"),)),
    "nodes.control.gateway_alive": Scenario(gateway_alive, ()),
    "nodes.services.card_names_remember": Scenario(card_names_remember, ()),
    "nodes.control.leases_renew": Scenario(leases_renew, ()),
    "nodes.commands.node_command_create": Scenario(node_command_create,
                                                   (created("node_command.created"),)),
    "nodes.commands.node_command_report": Scenario(node_command_report,
                                                   (changed("node_command.running"),)),
    "nodes.commands.node_command_report/stray": Scenario(
        node_command_report_stray, (created("node_command.stray_reported"),)),
    "nodes.commands.node_command_report/stray-changes": Scenario(
        node_command_report_stray_again, (changed("node_command.stray_reported"),)),
    # The command finishes and, with it, the drain (D1): two records change.
    "nodes.commands.node_command_report/last-of-a-drain": Scenario(
        node_command_report_last_of_a_drain,
        (changed("node_command.succeeded"), changed("node.drained"))),
    # L5: one event per command whose state moves and per stray; none for "still running".
    "nodes.commands.node_commands_reconcile": Scenario(node_commands_reconcile, (
        changed("node_command.failed"), changed("node_command.lost"),
        created("node_command.stray_reported"))),
    "nodes.scheduling.node_observe_storage_root": Scenario(node_observe_storage_root,
                                                           (changed("node.cordoned"),)),
    "nodes.scheduling.node_observe_storage_root/back": Scenario(
        node_observe_storage_root_back, (changed("node.uncordoned"),)),
    "nodes.scheduling.node_cordon": Scenario(node_cordon, (changed("node.cordoned"),)),
    "nodes.scheduling.node_cordon/new-reason": Scenario(node_cordon_new_reason,
                                                        (changed("node.cordoned"),)),
    "nodes.scheduling.node_uncordon": Scenario(node_uncordon, (changed("node.uncordoned"),)),
    "nodes.scheduling.node_drain": Scenario(node_drain, (changed("node.drained"),)),
    "nodes.scheduling.node_drain_settle": Scenario(node_drain_settle, (changed("node.drained"),)),
    "nodes.scheduling.node_remove": Scenario(node_remove, (changed("node.removed"),)),
    # D3: a gone machine removed by force is audited as forced.
    "nodes.scheduling.node_remove/forced": Scenario(node_remove_forced,
                                                    (changed("node.removed", forced=True),)),
    # L6: one event per storage cordon added or lifted.
    "nodes.scheduling.storage_cordon_sweep": Scenario(storage_cordon_sweep, (
        changed("node.cordoned"), changed("node.uncordoned"))),
    # L2–L4: one event per transition.
    "nodes.liveness.liveness_sweep": Scenario(liveness_sweep, (
        changed("node.quiet"), changed("node.quiet"), changed("node.gone"),
        changed("node.answering"))),
    # "Nothing is audited per read (they are observations, every few seconds); the manager
    # becoming unreachable and reachable again is."
    "nodes.clusters.cluster_refresh/a-read": Scenario(cluster_refresh, ()),
    "nodes.clusters.cluster_refresh/unreachable": Scenario(
        cluster_refresh_unreachable, (changed("fleet.cluster_unreachable"),)),
    "nodes.clusters.cluster_refresh/reachable-again": Scenario(
        cluster_refresh_reachable_again, (changed("fleet.cluster_reachable"),)),
    "nodes.clusters.clusters_refresh": Scenario(clusters_refresh,
                                                (changed("fleet.cluster_unreachable"),)),
    "placement.services.training_job_submit": Scenario(
        submitted(placement.training_job_submit, name="sft"),
        (created("trainingjob.admitted"),)),
    "placement.services.lifecycle_job_submit": Scenario(
        submitted(placement.lifecycle_job_submit, name="evals", kind="eval"),
        (created("lifecyclejob.admitted"),)),
    "placement.services.deployment_submit": Scenario(
        submitted(placement.deployment_submit, name="chat"), (created("deployment.admitted"),)),
    "placement.services.deployment_update": Scenario(deployment_update,
                                                     (changed("deployment.state_changed"),)),
    "placement.services.playground_session_submit": Scenario(
        submitted(placement.playground_session_submit, name="try"),
        (created("playgroundsession.admitted"),)),
    "placement.services.environment_submit": Scenario(
        submitted(placement.environment_submit, name="nb", manifest={"fleet": "gpu-lab"}),
        (created("environment.admitted"),)),
    "placement.services.storage_create": Scenario(storage_create(Volume),
                                                  (created("volume.created"),)),
    "placement.services.storage_create/dataset": Scenario(storage_create(Dataset),
                                                          (created("dataset.created"),)),
    # It dispatches the hand-over through the broker: run at once here, one event.
    "placement.clusters.handover_on_commit": Scenario(handover_on_commit,
                                                      (changed("trainingjob.handed_over"),)),
    "placement.clusters.cluster_job_handover": Scenario(cluster_job_handover,
                                                        (changed("trainingjob.handed_over"),)),
    "placement.clusters.cluster_job_handover/no-script": Scenario(
        cluster_job_handover_without_script, (changed("trainingjob.handover_failed"),)),
    # One event per hand-over and per state read back that differs from the one recorded.
    "placement.clusters.cluster_jobs_track": Scenario(cluster_jobs_track, (
        changed("trainingjob.handed_over"), changed("trainingjob.backend_state"))),
}


def function_of(scenario_name: str) -> str:
    return scenario_name.split("/")[0]


def public_functions() -> dict[str, Callable]:
    found = {}
    for module_name in WRITING_MODULES:
        module = importlib.import_module(module_name)
        for name, value in vars(module).items():
            if inspect.isfunction(value) and value.__module__ == module_name \
                    and not name.startswith("_"):
                found[f"{module_name}.{name}"] = value
    return found


def test_A1_every_public_function_of_the_writing_modules_is_classified():
    found = public_functions()
    audited = {function_of(name) for name, scenario in SCENARIOS.items() if scenario.events}
    exercised = {function_of(name) for name in SCENARIOS}
    listed = exercised | set(NOT_AUDITED) | READS
    assert not set(found) - listed, (
        f"public functions in none of SCENARIOS, NOT_AUDITED, READS: "
        f"{sorted(set(found) - listed)}")
    assert not listed - set(found), f"listed but no longer there: {sorted(listed - set(found))}"
    assert not READS & exercised, f"in READS and in SCENARIOS: {sorted(READS & exercised)}"
    assert set(NOT_AUDITED) <= exercised - audited, (
        f"NOT_AUDITED needs a scenario proving it records nothing, and none recording events: "
        f"{sorted(set(NOT_AUDITED) - (exercised - audited))}")
    assert exercised - set(NOT_AUDITED) <= audited, (
        f"writers with no scenario that records an event: "
        f"{sorted(exercised - audited - set(NOT_AUDITED))}")


@pytest.mark.parametrize("name", sorted(NOT_AUDITED))
def test_A1_a_write_left_unaudited_says_so_in_its_docstring(name):
    function = public_functions()[name]
    documented = " ".join(f"{inspect.getmodule(function).__doc__} {function.__doc__}".split())
    assert NOT_AUDITED[name] in documented, f"{name}: its docstring does not say why"


def test_A1_every_module_that_records_audit_events_is_a_writing_module():
    recording = set()
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            relative = path.relative_to(ROOT)
            if app == "audit" or "migrations" in relative.parts:
                continue  # the audit log itself, and history
            if RECORDS_AUDIT.search(path.read_text()):
                recording.add(".".join(relative.with_suffix("").parts))
    assert recording == set(WRITING_MODULES), (
        f"record audit events but are not WRITING_MODULES: "
        f"{sorted(recording - set(WRITING_MODULES))}; listed but record none: "
        f"{sorted(set(WRITING_MODULES) - recording)}")


@pytest.fixture
def world(admin_user, member, project, make_fleet, mint, monkeypatch):
    with contextlib.ExitStack() as stack:
        yield World(admin=admin_user, member=member, make_fleet=make_fleet, mint=mint,
                    monkeypatch=monkeypatch, stack=stack)


def problems_with(event: AuditEvent, expected: Event) -> list[str]:
    where = f"{event.action} on {event.target_type}:{event.target_id}"
    problems = []
    if not (event.actor_type and event.actor_label):
        problems.append(f"{where}: no actor ({event.actor_type!r}, {event.actor_label!r})")
    if not (event.target_type and event.target_id):
        problems.append(f"{where}: no target")
    if expected.change in (CREATED, CHANGED) and event.after is None:
        problems.append(f"{where}: no after")
    if expected.change in (CHANGED, DELETED) and event.before is None:
        problems.append(f"{where}: no before, though it changed an existing record")
    if event.forced != expected.forced:
        problems.append(f"{where}: forced={event.forced}, expected {expected.forced}")
    return problems


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_A1_each_write_records_one_event_per_change(world, name):
    scenario = SCENARIOS[name]
    call = scenario.arrange(world)
    count = AuditEvent.objects.count()
    last = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
    call()
    recorded = list(AuditEvent.objects.filter(id__gt=last).order_by("id"))
    assert AuditEvent.objects.count() - count == len(recorded)
    expected = {event.action: event for event in scenario.events}
    actions = sorted(event.action for event in recorded)
    assert actions == sorted(event.action for event in scenario.events), (
        f"{name} recorded {actions or 'no event'}, expected "
        f"{sorted(event.action for event in scenario.events) or 'none'}")
    problems = [problem for event in recorded
                for problem in problems_with(event, expected[event.action])]
    assert not problems, f"{name}: " + "; ".join(problems)
