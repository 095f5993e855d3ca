"""The arrangements of the nodes' writes for the A1 scenarios: each sets up what one call
needs and returns that call."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from audit.services import Actor
from nodes.choices import CordonSource, SchedulingState
from nodes.models import (
    CardAlias,
    ClusterSnapshot,
    ControlSession,
    GatewayReplica,
    HardwareSeries,
    Node,
    NodeCordon,
    quiet_threshold,
)
from nodes.services import clusters as node_clusters
from nodes.services import (
    commands,
    control,
    cordons,
    drains,
    hardware,
    join,
    liveness,
    removal,
    sessions,
    strays,
)
from nodes.services.commands import Reported
from tests.conftest import H100_DEVICE_INVENTORY, SYSTEM, make_csr

from .scenarios import RUN


def join_token_mint(w):
    fleet = w.fleet()
    return lambda: join.join_token_mint(actor=Actor.of_user(w.admin), fleet=fleet)


def join_token_revoke(w):
    token, _ = w.mint(w.fleet())
    return lambda: join.join_token_revoke(actor=Actor.of_user(w.admin), token=token)


def node_join(w, token: str = ""):
    fleet = w.fleet()
    token = token or w.mint(fleet)[1]
    return lambda: join.node_join(
        token=token, fleet_id=fleet.id, csr=make_csr()[1], inventory=H100_DEVICE_INVENTORY
    )


def node_join_refused(w):
    refused_join = node_join(w, token="not-a-token")

    def call():
        with pytest.raises(join.JoinRefused):
            refused_join()

    return call


def card_alias_map(w):
    alias = CardAlias.objects.create(name="Mystery X1")
    series = HardwareSeries.objects.get(slug="h100")
    return lambda: hardware.card_alias_map(actor=Actor.of_user(w.admin), alias=alias, series=series)


def series_create(w):
    return lambda: hardware.series_create(
        actor=Actor.of_user(w.admin), slug="ascend-910c", name="Huawei Ascend 910C", vendor="huawei"
    )


def series_update(w):
    series = HardwareSeries.objects.get(slug="h100")
    return lambda: hardware.series_update(
        actor=Actor.of_user(w.admin), series=series, name="NVIDIA H100 (all)", vendor=series.vendor
    )


def series_delete(w):
    series = hardware.series_create(actor=SYSTEM, slug="ascend-910c", name="Huawei Ascend 910C")
    return lambda: hardware.series_delete(actor=Actor.of_user(w.admin), series=series)


def card_alias_add(w, series: str = ""):
    mapped = HardwareSeries.objects.get(slug=series) if series else None
    return lambda: hardware.card_alias_add(
        actor=Actor.of_user(w.admin), name="Mystery X2", series=mapped
    )


def card_alias_add_mapped(w):
    return card_alias_add(w, series="h100")


def card_alias_delete(w):
    alias = hardware.card_alias_add(actor=SYSTEM, name="Mystery X3")
    return lambda: hardware.card_alias_delete(actor=Actor.of_user(w.admin), alias=alias)


def session_open(w):
    result = w.joined()
    return lambda: sessions.session_open(
        node_id=result.node.id, serial=result.certificate.serial, gateway="gw-1"
    )


def session_open_replacing(w):
    session = w.live()
    serial = session.node.credentials.get().serial
    return lambda: sessions.session_open(node_id=session.node_id, serial=serial, gateway="gw-2")


def session_close(w):
    session = w.live()
    return lambda: sessions.session_close(session_id=session.id, reason="stream ended")


def credential_rotate(w):
    result = w.joined()
    return lambda: control.credential_rotate(
        node_id=result.node.id, serial=result.certificate.serial, csr=make_csr()[1]
    )


def node_report_inventory(w):
    session = w.live()
    return lambda: control.node_report_inventory(
        node_id=session.node_id, inventory=H100_DEVICE_INVENTORY
    )


def node_report_inventory_unchanged(w):
    node = w.placeable()
    return lambda: control.node_report_inventory(node_id=node.id, inventory=H100_DEVICE_INVENTORY)


def gateway_started(w):
    return lambda: control.gateway_started(name="gw-1")


def gateway_started_again(w):
    an_hour_ago = timezone.now() - timedelta(hours=1)
    GatewayReplica.objects.create(name="gw-1", started_at=an_hour_ago, seen_at=an_hour_ago)
    return lambda: control.gateway_started(name="gw-1")


def sessions_left_open_close(w):
    session = w.live()  # on gw-1, whose process was then killed
    ControlSession.objects.filter(pk=session.pk).update(lease_expires_at=timezone.now())
    return lambda: control.sessions_left_open_close(
        gateway="gw-1", serving_since=session.opened_at + timedelta(1)
    )


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
    return lambda: hardware.card_names_remember(["Mystery Accelerator Z"], timezone.now())


def leases_renew(w):
    session = w.live()
    return lambda: control.leases_renew({str(session.id): timezone.now()})


def node_command_create(w):
    node = w.node()
    return lambda: commands.node_command_create(
        actor=Actor.of_user(w.admin), node=node, kind="run", payload=RUN
    )


def node_command_report(w, command_id: str = "", reported: Reported | None = None):
    node = w.node()
    command = w.command(node)
    return lambda: commands.node_command_report(
        node_id=node.id, reported=reported or Reported(command_id or command.id, "running")
    )


def node_command_report_stray(w):
    return node_command_report(w, command_id="c-stray")


def node_command_report_stray_again(w):
    node = w.node()
    commands.node_command_report(node_id=node.id, reported=Reported("c-stray", "running"))
    return lambda: commands.node_command_report(
        node_id=node.id, reported=Reported("c-stray", "failed", 3)
    )


def node_strays_flag(w):
    """A Hello's strays, past what a node keeps: one event for all of them."""
    node = w.node()
    w.monkeypatch.setattr(settings, "TUNEPLANE_STRAY_COMMANDS_KEPT", 2)
    report = [Reported(f"c-stray-{i}", "running") for i in range(5)]
    return lambda: strays.node_strays_flag(node_id=node.id, reported=report, now=timezone.now())


def node_command_report_last_of_a_drain(w):
    node = w.node("draining")
    command = w.command(node, "running")
    return lambda: commands.node_command_report(
        node_id=node.id, reported=Reported(command.id, "succeeded", 0)
    )


def node_commands_reconcile(w):
    """Finished offline, forgotten by the node, still running (no change), and a stray."""
    node = w.node()
    finished, forgotten, running = (w.command(node, "running") for _ in range(3))
    report = [
        Reported(finished.id, "failed", 3),
        Reported(running.id, "running"),
        Reported("c-stray", "running"),
    ]
    return lambda: commands.node_commands_reconcile(node_id=node.id, reported=report)


def node_observe_storage_root(w, visible: bool = False):
    node = w.node()
    if visible:
        NodeCordon.objects.create(
            node=node,
            source=CordonSource.STORAGE,
            created_at=timezone.now(),
            reason=cordons.STORAGE_LOST,
        )
    return lambda: cordons.node_observe_storage_root(node_id=node.id, visible=visible)


def node_observe_storage_root_back(w):
    return node_observe_storage_root(w, visible=True)


def node_cordon(w):
    node = w.node()
    return lambda: cordons.node_cordon(actor=Actor.of_user(w.admin), node=node, reason="fan noise")


def node_cordon_new_reason(w):
    node = w.node()
    cordons.node_cordon(actor=Actor.of_user(w.admin), node=node, reason="fan noise")
    return lambda: cordons.node_cordon(
        actor=Actor.of_user(w.admin), node=node, reason="fan replaced"
    )


def node_uncordon(w):
    node = w.node()
    cordons.node_cordon(actor=Actor.of_user(w.admin), node=node, reason="fan noise")
    return lambda: cordons.node_uncordon(actor=Actor.of_user(w.admin), node=node)


def node_drain(w):
    node = w.node()
    return lambda: drains.node_drain(
        actor=Actor.of_user(w.admin), node=node, reason="leaving the rack"
    )


def node_resume(w):
    node = w.node()
    drains.node_drain(actor=Actor.of_user(w.admin), node=node, reason="leaving the rack")
    return lambda: drains.node_resume(actor=Actor.of_user(w.admin), node=node)


def fleet_nodes_drain(w):
    """One busy machine starts draining, one idle machine is drained at once."""
    w.command(w.node(), state="running")
    w.node()
    return lambda: drains.fleet_nodes_drain(
        actor=Actor.of_user(w.admin), fleet=w.fleet(), reason="new racks"
    )


def drains_overdue_mark(w):
    node = w.node()
    w.command(node, state="running")
    drains.node_drain(actor=SYSTEM, node=node, reason="leaving", deadline=_soon())
    Node.objects.filter(pk=node.pk).update(drain_deadline=timezone.now() - timedelta(seconds=1))
    return drains.drains_overdue_mark


def _soon():
    return timezone.now() + timedelta(hours=1)


def node_drain_settle(w):
    node = w.node("draining")
    return lambda: drains.node_drain_settle(node_id=node.id)


def node_remove(w, state: str = "drained", force: bool = False):
    node = w.node(state)
    return lambda: removal.node_remove(actor=Actor.of_user(w.admin), node=node, force=force)


def node_remove_forced(w):
    return node_remove(w, state="gone", force=True)


def removed_nodes_detach(w):
    """A removed node and one still drained: only the removed one is detached (F7)."""
    removed = w.node("drained")
    removal.node_remove(actor=SYSTEM, node=removed)
    w.node("drained")
    return lambda: removal.removed_nodes_detach(actor=Actor.of_user(w.admin), fleet=w.fleet())


def storage_cordon_sweep(w):
    """One node lost its storage root unseen by the gateway; another's came back."""
    lost, back = w.node(), w.node()
    Node.objects.filter(pk=lost.pk).update(
        inventory={**H100_DEVICE_INVENTORY, "storage_root_visible": False}
    )
    NodeCordon.objects.create(
        node=back,
        source=CordonSource.STORAGE,
        created_at=timezone.now(),
        reason=cordons.STORAGE_LOST,
    )
    return cordons.storage_cordon_sweep


def liveness_sweep(w):
    """A gateway listening all day; one node silent past every threshold (quiet for train
    and serve, then gone), one back after it was quiet for serve (answering again)."""
    now = timezone.now()
    GatewayReplica.objects.create(
        name="gw-1", started_at=now - timedelta(days=1), seen_at=now + timedelta(days=1)
    )
    fleet = w.make_fleet("sweep-lab", kind="node", capabilities=["train", "serve"])
    silent = now - quiet_threshold("train") - timedelta(minutes=1)
    Node.objects.create(
        fleet=fleet,
        scheduling_state=SchedulingState.SCHEDULABLE,
        inventory=H100_DEVICE_INVENTORY,
        last_seen_at=silent,
        inventory_observed_at=silent,
    )
    Node.objects.create(
        fleet=fleet,
        scheduling_state=SchedulingState.SCHEDULABLE,
        inventory=H100_DEVICE_INVENTORY,
        last_seen_at=now,
        inventory_observed_at=now,
        quiet_serve=True,
    )
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
    ClusterSnapshot.objects.filter(fleet=fleet).update(error="HTTP 500", error_since=timezone.now())
    return lambda: node_clusters.cluster_refresh(fleet)


def clusters_refresh(w):
    cluster_refresh_unreachable(w)
    return node_clusters.clusters_refresh


def cordon_add(w):
    node = cordons.node_locked(w.node().pk)
    return lambda: cordons.cordon_add(node, CordonSource.OPERATOR, "fan noise", SYSTEM)


def cordon_lift(w):
    node = cordons.node_locked(w.node().pk)
    cordon = cordons.cordon_add(node, CordonSource.OPERATOR, "fan noise", SYSTEM)
    return lambda: cordons.cordon_lift(node, cordon, SYSTEM)


def node_state_set(w):
    node = cordons.node_locked(w.node().pk)
    return lambda: drains.node_state_set(node, "drained", SYSTEM)


def node_drain_locked(w):
    node = cordons.node_locked(w.node().pk)
    return lambda: drains.node_drain_locked(node, SYSTEM, "leaving the rack", None)
