"""H5's decisions, pure (nodes/checks.py): a Fleet's health check read from its config, when a
card's check is owed, what a result makes of its record, whether the card may take work, and
the config's validation — at each boundary. The checks on the real database and a real agent
are tests/nodes/test_health_checks.py and tests/e2e/test_health_checks.py."""

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodes import checks
from tuneplane.deployment_settings import check_config
from tuneplane.errors import ValidationFailed

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def record(state: str, at: datetime = NOW, **more) -> dict:
    return {"index": 0, "state": state, "at": at.isoformat(), **more}


def test_H5_a_fleet_names_its_check_with_defaults_for_what_it_leaves_out():
    check = checks.HealthCheck.of({"health_check": {"command": "nvidia-smi -q"}})
    minutes = timedelta(seconds=300), timedelta(seconds=60)
    assert check == checks.HealthCheck("nvidia-smi -q", *minutes)
    given_ = {"command": "true", "interval_seconds": 10, "timeout_seconds": 1}
    check = checks.HealthCheck.of({"health_check": given_})
    assert (check.interval, check.timeout) == (timedelta(seconds=10), timedelta(seconds=1))


@pytest.mark.parametrize(
    "config", [None, {}, {"health_check": None}, {"health_check": {"command": " "}}, []]
)
def test_H5_a_fleet_without_a_usable_check_has_none(config):
    assert checks.HealthCheck.of(config) is None


def test_H5_a_checks_start_is_a_member_start_on_its_one_card():
    check = checks.HealthCheck.of({"health_check": {"command": "dcgmi diag -r 1"}})
    payload = check.payload({"index": 3, "uuid": "GPU-3", "name": "H100"}, grace=5.0)
    assert payload["script"] == "dcgmi diag -r 1"
    assert payload["cards"] == [{"index": 3, "uuid": "GPU-3"}]
    assert payload["labels"] == {checks.LABEL: "GPU-3"}
    assert payload["health_check"] is True and payload["grace_seconds"] == 5.0
    assert payload["env"] == {"TUNEPLANE_HEALTH_CHECK_CARD": "3"}


@pytest.mark.parametrize(
    ("card", "placeable"),
    [
        (None, False),  # never checked: not before its first check
        (record(checks.DUE), False),  # owed one (a member left it)
        (record(checks.CHECKING), False),
        (record(checks.PASSED), True),
        (record(checks.FAILED), True),  # out of work by its quarantine, not by this (H7)
    ],
)
def test_H5_a_card_takes_work_only_once_its_check_ended(card, placeable):
    assert checks.placeable(card) is placeable


@pytest.mark.parametrize(
    ("card", "due"),
    [
        (None, True),
        (record(checks.DUE), True),
        (record(checks.CHECKING, at=NOW - 10 * MINUTE), False),  # one check at a time
        (record(checks.PASSED, at=NOW - 5 * MINUTE), True),  # exactly the interval
        (record(checks.PASSED, at=NOW - 5 * MINUTE + timedelta(seconds=1)), False),
        (record(checks.FAILED, at=NOW - 5 * MINUTE), True),  # a quarantined card re-checked
        (record(checks.FAILED, at=NOW - MINUTE), False),
    ],
)
def test_H5_an_idle_cards_check_is_owed_once_never_checked_owed_or_an_interval_old(card, due):
    assert checks.due(card, NOW, 5 * MINUTE) is due


def test_H5_a_check_times_out_at_its_timeout_and_not_a_second_before():
    running = checks.started(None, index=1, command="c-1", now=NOW)
    assert running["state"] == checks.CHECKING and running["command"] == "c-1"
    assert not checks.timed_out(running, NOW + MINUTE - timedelta(seconds=1), MINUTE)
    assert checks.timed_out(running, NOW + MINUTE, MINUTE)
    ended = checks.finished(running, passed=True, exit_code=0, output="", now=NOW)
    assert not checks.timed_out(ended, NOW + 2 * MINUTE, MINUTE)  # its result is in
    assert not checks.timed_out(None, NOW, MINUTE)


def test_H5_a_result_waits_for_the_checks_cleanup_to_become_the_cards_state():
    running = checks.started(record(checks.PASSED, passes=3), index=0, command="c", now=NOW)
    ended = checks.finished(running, passed=True, exit_code=0, output="ok\n", now=NOW)
    assert (ended["state"], ended["result"], ended["passes"]) == (checks.CHECKING, "passed", 4)
    assert not checks.placeable(ended)  # the node holds the card until the cleanup (R7)
    done = checks.cleaned(ended, NOW)
    assert (done["state"], done["command"]) == (checks.PASSED, None)


def test_H5_a_failure_counts_passes_from_zero_and_keeps_the_output_tail():
    running = checks.started(record(checks.PASSED, passes=3), index=0, command="c", now=NOW)
    output = "x" * 500 + "row remapping pending"
    ended = checks.finished(running, passed=False, exit_code=2, output=output, now=NOW)
    assert (ended["result"], ended["passes"], ended["exit_code"]) == ("failed", 0, 2)
    assert len(ended["output"]) == checks.MAX_OUTPUT and ended["output"].endswith("pending")
    assert checks.reason(ended) == "health check failed (exit 2): " + ended["output"]
    assert checks.cleaned(ended, NOW)["state"] == checks.FAILED


def test_H5_a_second_result_of_one_check_changes_nothing():
    """A timeout fails the check; the stopped process's own exit after it is not a pass."""
    running = checks.started(None, index=0, command="c", now=NOW)
    failed = checks.finished(
        {**running, "timed_out": True}, passed=False, exit_code=None, output="", now=NOW
    )
    assert checks.reason(failed) == "health check failed (timed out)"
    assert checks.finished(failed, passed=True, exit_code=0, output="", now=NOW) is failed


def test_H5_a_check_lost_with_its_node_is_owed_again():
    running = checks.started(record(checks.PASSED), index=0, command="c", now=NOW)
    assert checks.cleaned(running, NOW + MINUTE)["state"] == checks.DUE


def test_H5_a_card_owed_a_check_while_one_runs_does_not_count_that_ones_pass():
    """A member's end or a quarantine during a check: that check began before and proves
    nothing since; the card is owed another once it is cleaned."""
    running = checks.started(record(checks.PASSED, passes=2), index=0, command="c", now=NOW)
    owed = checks.owed(running, NOW)
    assert owed["state"] == checks.CHECKING and owed["passes"] == 0
    ended = checks.finished(owed, passed=True, exit_code=0, output="", now=NOW)
    assert ended["passes"] == 0
    assert checks.cleaned(ended, NOW)["state"] == checks.DUE


def test_H5_a_card_a_member_left_owes_a_check_at_once():
    owed = checks.owed(record(checks.PASSED, at=NOW, passes=4), NOW)
    assert owed["state"] == checks.DUE and owed["passes"] == 0
    assert checks.due(owed, NOW, 5 * MINUTE)
    assert checks.owed(None, NOW) is None


def test_H5_shown_says_state_exit_output_and_passes():
    assert checks.shown(None) is None
    shown = checks.shown(record(checks.FAILED, exit_code=1, output="bad", passes=0))
    assert shown == {
        "state": "failed",
        "at": NOW.isoformat(),
        "exit_code": 1,
        "output": "bad",
        "passes": 0,
    }


@given(st.lists(st.sampled_from(["pass", "fail", "owe", "lose"]), max_size=30))
def test_H5_a_cards_passes_count_only_checks_begun_after_its_last_fault_or_member(events):
    """Property: whatever the sequence, a card's passes are the passes in a row since the
    last failure or the last time it was owed a check, and it takes work only after a check
    that ended."""
    card, in_a_row = None, 0
    for event in events:
        if event == "owe":
            card = checks.owed(card, NOW)
            in_a_row = 0
            assert card is None or not checks.placeable(card)
            continue
        card = checks.started(card, index=0, command="c", now=NOW)
        assert not checks.placeable(card)
        if event != "lose":
            card = checks.finished(
                card,
                passed=event == "pass",
                exit_code=0 if event == "pass" else 1,
                output="",
                now=NOW,
            )
            in_a_row = in_a_row + 1 if event == "pass" else 0
        card = checks.cleaned(card, NOW)
        if event == "lose":
            assert card["state"] == checks.DUE
        else:
            assert card["passes"] == in_a_row
            assert card["state"] == (checks.PASSED if event == "pass" else checks.FAILED)


@pytest.mark.parametrize(
    "said",
    [
        {"command": "true", "interval_seconds": 10, "timeout_seconds": 1},
        {"command": "true", "interval_seconds": 86_400, "timeout_seconds": 3_600},
        {"command": "dcgmi diag -r 1"},
    ],
)
def test_H5_a_health_check_within_its_bounds_is_accepted(said):
    assert check_config("node", {"health_check": said})


@pytest.mark.parametrize(
    ("said", "names"),
    [
        ("true", "must be an object"),
        ({}, "command must be"),
        ({"command": ""}, "command must be"),
        ({"command": ["nvidia-smi"]}, "command must be"),
        ({"command": "true", "interval_seconds": 9}, "interval_seconds"),
        ({"command": "true", "interval_seconds": 86_401}, "interval_seconds"),
        ({"command": "true", "timeout_seconds": 0}, "timeout_seconds"),
        ({"command": "true", "timeout_seconds": 3_601}, "timeout_seconds"),
        ({"command": "true", "timeout_seconds": True}, "timeout_seconds"),
        ({"command": "true", "timeout_seconds": 1.5}, "timeout_seconds"),
        ({"command": "true", "intervall_seconds": 60}, "intervall_seconds"),
    ],
)
def test_H5_a_health_check_out_of_bounds_is_refused_naming_its_field(said, names):
    with pytest.raises(ValidationFailed) as refused:
        check_config("node", {"health_check": said})
    assert refused.value.field == "config.health_check"
    assert names in refused.value.message


# H5's built-in check on the agent, each sample: a card whose device node cannot be opened.

DEVICES = [{"index": i, "uuid": f"GPU-{i}", "name": "NVIDIA H100 80GB HBM3"} for i in range(3)]


def test_H5_the_agent_names_each_card_whose_device_node_cannot_be_opened(tmp_path):
    from nodes.agent import telemetry

    (tmp_path / "nvidia0").write_text("")  # opens
    (tmp_path / "nvidia2").write_text("")
    (tmp_path / "nvidia2").chmod(0)  # root opens it all the same: only a missing node
    assert telemetry.unopened(DEVICES, str(tmp_path)) == {
        "GPU-1": f"cannot open {tmp_path}/nvidia1: No such file or directory"
    }
    assert telemetry.unopened([], str(tmp_path)) == {}


def test_H5_a_real_drivers_sample_carries_the_fault_and_a_files_its_own(tmp_path):
    from nodes.agent import telemetry

    class Driver:
        name = telemetry.NVIDIA_SMI
        host = None

        def cards(self, devices):
            return [{"uuid": d["uuid"], "index": d["index"]} for d in devices]

    for device in DEVICES[:2]:
        (tmp_path / f"nvidia{device['index']}").write_text("")
    host = telemetry.Host(str(tmp_path))
    said = telemetry.sample(Driver(), host, DEVICES, dev=str(tmp_path))
    assert [card["fault"] for card in said["cards"]] == [
        "",
        "",
        f"cannot open {tmp_path}/nvidia2: No such file or directory",
    ]
    Driver.name = telemetry.FILE  # a file source's cards are as the file says
    assert "fault" not in telemetry.sample(Driver(), host, DEVICES, dev=str(tmp_path))["cards"][0]


def test_H5_a_cards_fault_crosses_the_wire_and_is_news():
    from nodes.agent import telemetry, wire

    card = {"index": 1, "uuid": "GPU-1", "name": "H100", "fault": "cannot open /dev/nvidia1"}
    sent = {"source": "nvml", "cards": [card]}
    got = wire.telemetry_sample(wire.telemetry_message(sent).telemetry)
    assert got["cards"][0]["fault"] == "cannot open /dev/nvidia1"
    numbers = dict.fromkeys(wire.CARD_NUMBERS, 0)
    quiet = {"source": "nvml", "cpu_percent": 0, "memory_used_bytes": 0, "memory_total_bytes": 0}
    before = {**quiet, "cards": [{**card, **numbers, "fault": ""}]}
    after = {**quiet, "cards": [{**card, **numbers}]}
    assert telemetry.news(before, after)
    assert not telemetry.news(after, after)
