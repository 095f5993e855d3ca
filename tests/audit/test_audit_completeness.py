"""A1: every service function that writes records one audit event per change it makes.

The writers are found, not listed by hand: every public function of the modules that record
audit events (WRITING_MODULES). Each one is in SCENARIOS (set up, called once, its new events
checked: who, what, which target, before and after), in NOT_AUDITED (with the reason its own
docstring gives), or in READS (it writes nothing). A new public function in those modules
fails the classification test until it is placed; a module that starts recording audit events
fails until it is listed. The other half of A1 — events are never edited or deleted — is
tests/audit/test_audit.py.
"""

import importlib
import inspect
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from audit.models import AuditEvent
from placement.models import Dataset, Volume
from placement.services import submission

from . import node_scenarios as nodes
from . import run_scenarios, serving_scenarios, session_scenarios, sharing_scenarios
from .scenarios import (
    CHANGED,
    CREATED,
    DELETED,
    Event,
    Scenario,
    api_token_create,
    api_token_revoke,
    changed,
    cluster_job_handover,
    cluster_job_handover_without_script,
    cluster_jobs_track,
    created,
    deleted,
    fleet_create,
    fleet_delete,
    fleet_delete_with_removed_nodes,
    fleet_set_state,
    fleet_update,
    handover_on_commit,
    login_locked_out,
    membership_add,
    membership_remove,
    project_create,
    project_delete,
    project_update,
    storage_create,
    submitted,
)

ROOT = Path(__file__).resolve().parents[2]
APPS = ("tuneplane", "audit", "fleets", "nodes", "placement")
WRITING_MODULES = (
    "fleets.services",
    "tuneplane.services",
    "nodes.services.join",
    "nodes.services.hardware",
    "nodes.services.control",
    "nodes.services.sessions",
    "nodes.services.commands",
    "nodes.services.strays",
    "nodes.services.cordons",
    "nodes.services.removal",
    "nodes.services.health",
    "nodes.services.checks",
    "nodes.services.drains",
    "nodes.services.liveness",
    "nodes.services.clusters",
    "placement.services.submission",
    "placement.services.storage",
    "placement.services.allocator",
    "placement.services.runs",
    "placement.services.members",
    "placement.services.reconcile",
    "placement.services.serving",
    "placement.services.playground",
    "placement.services.episodes",
    "placement.services.quotas",
    "placement.services.preempting",
    "placement.handover",
    "tuneplane.lifecycle",
)
# What a module that records audit events says: the audit services, or the table itself.
RECORDS_AUDIT = re.compile(r"audit_record|audit_auditevent|lifecycle import move")

READS = {
    "nodes.services.join.join_commands",  # formats the one-liners shown at mint
    "nodes.services.commands.checked",  # validates a node's report
    "nodes.services.commands.checkpoint_time",  # a pure conversion of a report's time (H4)
    "nodes.services.commands.command_active",  # a predicate
    "nodes.services.commands.payload_shown",  # a payload as shown
    "nodes.services.liveness.gone_threshold",  # a pure computation (L4)
    "nodes.services.liveness.console_hearing",  # reads the gateway replicas
    "nodes.services.control.replica_gone_after",  # a pure computation
    "placement.services.submission.project_for",  # reads the project and the membership
    "placement.services.reconcile.backoff",  # a pure computation
    "placement.services.runs.locked_run",  # row locks, in the one order
    "placement.services.runs.attempt_state",  # a pure decision
    "placement.services.members.reported_as",  # a pure mapping
    "placement.services.members.stop_grace",  # a setting
    "tuneplane.lifecycle.recording",  # notes the moves checked, for a test
    "nodes.services.cordons.node_locked",  # a row lock, the one every node writer takes
    "nodes.services.cordons.node_not_removed",  # D4's check
    "nodes.services.cordons.operator_reason",  # validates a cordon's or a drain's reason
    "nodes.services.drains.drain_deadline",  # validates a drain's deadline
    "fleets.services.fleet_hold",  # a row lock against deletion, taken before a join
    "nodes.services.health.health_breakers_lock",  # row locks (made where missing), H7
}
# Writes that are observations, not changes, in their own (or their module's) words.
NOT_AUDITED = {
    "nodes.services.control.leases_renew": "audited where it changes what an operator sees "
    "— except heartbeats, which only renew a lease",
    "nodes.services.control.gateway_alive": "Still listening: an observation, every few seconds, "
    "not audited (like a lease).",
    "nodes.services.hardware.card_names_remember": "An observation, not audited: the mapping "
    "an admin makes of it is.",
}

# Named "module.function", or "module.function/case" for a further case of one function.
SCENARIOS = {
    "fleets.services.fleet_create": Scenario(fleet_create, (created("fleet.created"),)),
    "fleets.services.fleet_update": Scenario(fleet_update, (changed("fleet.updated"),)),
    "fleets.services.fleet_set_state": Scenario(fleet_set_state, (changed("fleet.state_changed"),)),
    "fleets.services.fleet_delete": Scenario(fleet_delete, (deleted("fleet.deleted"),)),
    # F7: its removed nodes outlive it, each detached with an event of its own.
    "fleets.services.fleet_delete/with-removed-nodes": Scenario(
        fleet_delete_with_removed_nodes, (changed("node.detached"), deleted("fleet.deleted"))
    ),
    "tuneplane.services.api_token_create": Scenario(
        api_token_create, (created("api_token.created"),)
    ),
    "tuneplane.services.api_token_revoke": Scenario(
        api_token_revoke, (changed("api_token.revoked"),)
    ),
    "nodes.services.join.join_token_mint": Scenario(
        nodes.join_token_mint, (created("join_token.minted"),)
    ),
    "nodes.services.join.join_token_revoke": Scenario(
        nodes.join_token_revoke, (changed("join_token.revoked"),)
    ),
    "nodes.services.join.node_join": Scenario(nodes.node_join, (created("node.joined"),)),
    "nodes.services.join.node_join/refused": Scenario(
        nodes.node_join_refused, (created("node.join_refused"),)
    ),
    "tuneplane.services.project_create": Scenario(project_create, (created("project.created"),)),
    "tuneplane.services.project_update": Scenario(project_update, (changed("project.updated"),)),
    "tuneplane.services.project_delete": Scenario(project_delete, (deleted("project.deleted"),)),
    "tuneplane.services.membership_add": Scenario(membership_add, (created("membership.added"),)),
    "tuneplane.services.membership_remove": Scenario(
        membership_remove, (deleted("membership.removed"),)
    ),
    "tuneplane.services.login_locked_out": Scenario(
        login_locked_out, (created("login.locked_out"),)
    ),
    "nodes.services.hardware.series_create": Scenario(
        nodes.series_create, (created("hardware_series.created"),)
    ),
    "nodes.services.hardware.series_update": Scenario(
        nodes.series_update, (changed("hardware_series.updated"),)
    ),
    "nodes.services.hardware.series_delete": Scenario(
        nodes.series_delete, (deleted("hardware_series.deleted"),)
    ),
    "nodes.services.hardware.card_alias_add": Scenario(
        nodes.card_alias_add, (created("card_alias.added"),)
    ),
    # Added with a series: recorded unmapped, then mapped (nodes follow, J4).
    "nodes.services.hardware.card_alias_add/mapped": Scenario(
        nodes.card_alias_add_mapped, (created("card_alias.added"), changed("card_alias.mapped"))
    ),
    "nodes.services.hardware.card_alias_delete": Scenario(
        nodes.card_alias_delete, (deleted("card_alias.deleted"),)
    ),
    "nodes.services.hardware.card_alias_map": Scenario(
        nodes.card_alias_map, (changed("card_alias.mapped"),)
    ),
    "nodes.services.control.credential_rotate": Scenario(
        nodes.credential_rotate, (changed("node.credential_rotated"),)
    ),
    # The first report on a live session makes an enrolled node schedulable.
    "nodes.services.control.node_report_inventory": Scenario(
        nodes.node_report_inventory, (changed("node.inventory_reported"),)
    ),
    "nodes.services.control.node_report_inventory/unchanged": Scenario(
        nodes.node_report_inventory_unchanged, ()
    ),
    "nodes.services.control.gateway_started": Scenario(
        nodes.gateway_started, (created("gateway.started"),)
    ),
    "nodes.services.control.gateway_started/restart": Scenario(
        nodes.gateway_started_again, (changed("gateway.started"),)
    ),
    "nodes.services.control.sessions_left_open_close": Scenario(
        nodes.sessions_left_open_close, (changed("control_session.closed"),)
    ),
    "nodes.services.control.sessions_of_silent_replicas_close": Scenario(
        nodes.sessions_of_silent_replicas_close, (changed("control_session.closed"),)
    ),
    "nodes.services.control.gateway_alive": Scenario(nodes.gateway_alive, ()),
    "nodes.services.hardware.card_names_remember": Scenario(nodes.card_names_remember, ()),
    "nodes.services.control.leases_renew": Scenario(nodes.leases_renew, ()),
    "nodes.services.commands.node_command_create": Scenario(
        nodes.node_command_create, (created("node_command.created"),)
    ),
    "nodes.services.commands.node_command_report": Scenario(
        nodes.node_command_report, (changed("node_command.running"),)
    ),
    "nodes.services.commands.node_command_report/stray": Scenario(
        nodes.node_command_report_stray, (created("node_command.stray_reported"),)
    ),
    "nodes.services.strays.node_strays_flag": Scenario(
        nodes.node_strays_flag, (created("node_command.stray_reported"),)
    ),
    "nodes.services.commands.node_command_report/stray-changes": Scenario(
        nodes.node_command_report_stray_again, (changed("node_command.stray_reported"),)
    ),
    # The command finishes and, with it, the drain (D1): two records change.
    "nodes.services.commands.node_command_report/last-of-a-drain": Scenario(
        nodes.node_command_report_last_of_a_drain,
        (changed("node_command.succeeded"), changed("node.drained")),
    ),
    # L5: one event per command whose state moves and per stray; none for "still running".
    "nodes.services.commands.node_commands_reconcile": Scenario(
        nodes.node_commands_reconcile,
        (
            changed("node_command.failed"),
            changed("node_command.lost"),
            created("node_command.stray_reported"),
        ),
    ),
    "nodes.services.cordons.node_observe_storage_root": Scenario(
        nodes.node_observe_storage_root, (changed("node.cordoned"),)
    ),
    "nodes.services.cordons.node_observe_storage_root/back": Scenario(
        nodes.node_observe_storage_root_back, (changed("node.uncordoned"),)
    ),
    "nodes.services.cordons.node_cordon": Scenario(nodes.node_cordon, (changed("node.cordoned"),)),
    "nodes.services.cordons.node_cordon/new-reason": Scenario(
        nodes.node_cordon_new_reason, (changed("node.cordoned"),)
    ),
    "nodes.services.cordons.node_uncordon": Scenario(
        nodes.node_uncordon, (changed("node.uncordoned"),)
    ),
    "nodes.services.drains.node_drain": Scenario(nodes.node_drain, (changed("node.drained"),)),
    "nodes.services.drains.node_resume": Scenario(nodes.node_resume, (changed("node.resumed"),)),
    "nodes.services.cordons.cordon_add": Scenario(nodes.cordon_add, (changed("node.cordoned"),)),
    "nodes.services.cordons.cordon_lift": Scenario(
        nodes.cordon_lift, (changed("node.uncordoned"),)
    ),
    "nodes.services.drains.node_state_set": Scenario(
        nodes.node_state_set, (changed("node.drained"),)
    ),
    "nodes.services.drains.node_drain_locked": Scenario(
        nodes.node_drain_locked, (changed("node.drained"),)
    ),
    "nodes.services.drains.fleet_nodes_drain": Scenario(
        nodes.fleet_nodes_drain, (changed("node.draining"), changed("node.drained"))
    ),
    # D1: nothing is stopped at the deadline; one event per node marks it overdue.
    "nodes.services.drains.drains_overdue_mark": Scenario(
        nodes.drains_overdue_mark, (changed("node.drain_overdue"),)
    ),
    "nodes.services.drains.node_drain_settle": Scenario(
        nodes.node_drain_settle, (changed("node.drained"),)
    ),
    "nodes.services.removal.node_remove": Scenario(nodes.node_remove, (changed("node.removed"),)),
    "nodes.services.removal.removed_nodes_detach": Scenario(
        nodes.removed_nodes_detach, (changed("node.detached"),)
    ),
    # D3: a gone machine removed by force is audited as forced.
    "nodes.services.removal.node_remove/forced": Scenario(
        nodes.node_remove_forced, (changed("node.removed", forced=True),)
    ),
    # L6: one event per storage cordon added or lifted.
    "nodes.services.cordons.storage_cordon_sweep": Scenario(
        nodes.storage_cordon_sweep, (changed("node.cordoned"), changed("node.uncordoned"))
    ),
    # L2–L4: one event per transition.
    "nodes.services.liveness.liveness_sweep": Scenario(
        nodes.liveness_sweep,
        (
            changed("node.quiet"),
            changed("node.quiet"),
            changed("node.gone"),
            changed("node.answering"),
        ),
    ),
    # "Nothing is audited per read (they are observations, every few seconds); the manager
    # becoming unreachable and reachable again is."
    "nodes.services.clusters.cluster_refresh/a-read": Scenario(nodes.cluster_refresh, ()),
    "nodes.services.clusters.cluster_refresh/unreachable": Scenario(
        nodes.cluster_refresh_unreachable, (changed("fleet.cluster_unreachable"),)
    ),
    "nodes.services.clusters.cluster_refresh/reachable-again": Scenario(
        nodes.cluster_refresh_reachable_again, (changed("fleet.cluster_reachable"),)
    ),
    "nodes.services.clusters.clusters_refresh": Scenario(
        nodes.clusters_refresh, (changed("fleet.cluster_unreachable"),)
    ),
    "placement.services.submission.training_job_submit": Scenario(
        submitted(submission.training_job_submit, name="sft", command=["true"]),
        (created("trainingjob.admitted"),),
    ),
    "placement.services.submission.lifecycle_job_submit": Scenario(
        submitted(submission.lifecycle_job_submit, name="evals", kind="eval", script="true"),
        (created("lifecyclejob.admitted"),),
    ),
    "placement.services.submission.environment_submit": Scenario(
        submitted(submission.environment_submit, name="nb", manifest={"fleet": "gpu-lab"}),
        (created("environment.admitted"),),
    ),
    "placement.services.storage.storage_create": Scenario(
        storage_create(Volume), (created("volume.created"),)
    ),
    "placement.services.storage.storage_create/dataset": Scenario(
        storage_create(Dataset), (created("dataset.created"),)
    ),
    # It dispatches the hand-over through the broker: run at once here, one event.
    "placement.handover.handover_on_commit": Scenario(
        handover_on_commit, (changed("trainingjob.handed_over"),)
    ),
    "placement.handover.cluster_job_handover": Scenario(
        cluster_job_handover, (changed("trainingjob.handed_over"),)
    ),
    "placement.handover.cluster_job_handover/no-script": Scenario(
        cluster_job_handover_without_script, (changed("trainingjob.handover_failed"),)
    ),
    # One event per hand-over and per state read back that differs from the one recorded.
    "placement.handover.cluster_jobs_track": Scenario(
        cluster_jobs_track,
        (changed("trainingjob.handed_over"), changed("trainingjob.backend_state")),
    ),
}


SCENARIOS.update(run_scenarios.SCENARIOS)
SCENARIOS.update(serving_scenarios.SCENARIOS)
READS |= serving_scenarios.READS
SCENARIOS.update(session_scenarios.SCENARIOS)
READS |= session_scenarios.READS
SCENARIOS.update(sharing_scenarios.SCENARIOS)
READS |= sharing_scenarios.READS


def function_of(scenario_name: str) -> str:
    return scenario_name.split("/")[0]


def public_functions() -> dict[str, Callable]:
    found = {}
    for module_name in WRITING_MODULES:
        module = importlib.import_module(module_name)
        for name, value in vars(module).items():
            if (
                inspect.isfunction(value)
                and value.__module__ == module_name
                and not name.startswith("_")
            ):
                found[f"{module_name}.{name}"] = value
    return found


def test_A1_every_public_function_of_the_writing_modules_is_classified():
    found = public_functions()
    audited = {function_of(name) for name, scenario in SCENARIOS.items() if scenario.events}
    exercised = {function_of(name) for name in SCENARIOS}
    listed = exercised | set(NOT_AUDITED) | READS
    assert not set(found) - listed, (
        f"public functions in none of SCENARIOS, NOT_AUDITED, READS: {sorted(set(found) - listed)}"
    )
    assert not listed - set(found), f"listed but no longer there: {sorted(listed - set(found))}"
    assert not READS & exercised, f"in READS and in SCENARIOS: {sorted(READS & exercised)}"
    assert set(NOT_AUDITED) <= exercised - audited, (
        f"NOT_AUDITED needs a scenario proving it records nothing, and none recording events: "
        f"{sorted(set(NOT_AUDITED) - (exercised - audited))}"
    )
    assert exercised - set(NOT_AUDITED) <= audited, (
        f"writers with no scenario that records an event: "
        f"{sorted(exercised - audited - set(NOT_AUDITED))}"
    )


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
                parts = relative.with_suffix("").parts
                recording.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    assert recording == set(WRITING_MODULES), (
        f"record audit events but are not WRITING_MODULES: "
        f"{sorted(recording - set(WRITING_MODULES))}; listed but record none: "
        f"{sorted(set(WRITING_MODULES) - recording)}"
    )


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
        f"{sorted(event.action for event in scenario.events) or 'none'}"
    )
    problems = [
        problem for event in recorded for problem in problems_with(event, expected[event.action])
    ]
    assert not problems, f"{name}: " + "; ".join(problems)
