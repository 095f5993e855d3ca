"""How slurmrestd's node fields read as machines (DESIGN.md §6), for the shapes a one-node
test cluster does not produce: several GPU types, index lists with commas, v0.0.36's null
state_flags, down and not-responding nodes."""

import pytest

from nodes.backends.slurm import gres_cards, scheduling_state_of
from nodes.backends.slurm_api import DIALECTS, Submission


@pytest.mark.parametrize(
    "gres, cards",
    [
        ("gpu:h100:4", {"h100": 4}),
        ("gpu:h100:4(S:0-1)", {"h100": 4}),
        ("gpu:h100:2(IDX:0,2),gpu:a100:1(IDX:0)", {"h100": 2, "a100": 1}),
        ("gpu:8", {"gpu": 8}),
        ("gpu:h100:0(IDX:N/A)", {"h100": 0}),
        ("", {}),
        (None, {}),
        ("mps:100,gpu:l40s:2", {"l40s": 2}),
    ],
)
def test_gres_strings_read_as_card_counts(gres, cards):
    assert gres_cards(gres) == cards


@pytest.mark.parametrize(
    "node, state",
    [
        ({"state": "idle", "state_flags": []}, "schedulable"),
        ({"state": "mixed", "state_flags": None}, "schedulable"),  # v0.0.36
        ({"state": "mixed", "state_flags": ["DRAIN"], "reason": "bad fan"}, "cordoned"),
        ({"state": "drained", "state_flags": None}, "cordoned"),
        ({"state": "down", "state_flags": [], "reason": "Not responding"}, "gone"),
        ({"state": "idle", "state_flags": ["NOT_RESPONDING"]}, "gone"),
    ],
)
def test_a_drain_or_a_down_node_is_a_cordon_or_gone_the_console_did_not_make(node, state):
    assert scheduling_state_of(node)[0] == state


@pytest.mark.parametrize(
    "version, node, state, flags",
    [
        ("v0.0.38", {"state": "mixed", "state_flags": ["DRAIN"]}, "mixed", ["DRAIN"]),
        ("v0.0.40", {"state": ["MIXED", "DRAIN"]}, "mixed", ["DRAIN"]),
        ("v0.0.41", {"state": ["IDLE"]}, "idle", []),
        ("v0.0.42", {"state": ["DOWN", "NOT_RESPONDING"]}, "down", ["NOT_RESPONDING"]),
        ("v0.0.42", {"state": []}, "", []),
    ],
)
def test_each_api_versions_node_state_reads_as_v0_0_38_spells_it(version, node, state, flags):
    read = DIALECTS[version].node(node)
    assert (read["state"], read["state_flags"]) == (state, flags)


def test_a_drained_node_in_v0_0_40_on_is_a_cordon_with_slurms_reason():
    node = DIALECTS["v0.0.42"].node({"state": ["IDLE", "DRAIN"], "reason": "bad fan"})
    assert scheduling_state_of(node) == ("cordoned", "Slurm drain: bad fan")


@pytest.mark.parametrize(
    "version, state", [("v0.0.38", "RUNNING"), ("v0.0.40", ["RUNNING"]), ("v0.0.42", [])]
)
def test_a_jobs_state_is_its_base_state_in_each_version(version, state):
    assert DIALECTS[version].job_state({"job_state": state}) == (state and "RUNNING" or "UNKNOWN")


SUBMISSION = Submission(
    script="#!/bin/sh\ntrue\n",
    name="j",
    nodes=2,
    workdir="/w",
    gres="gpu:h100:2",
    comment="tp-k",
    partition="debug",
)


def test_a_submission_in_v0_0_38_has_the_script_beside_the_job_and_gres():
    body = DIALECTS["v0.0.38"].submission(SUBMISSION)
    assert body["script"] == SUBMISSION.script
    assert body["job"]["gres"] == "gpu:h100:2" and body["job"]["nodes"] == 2
    assert body["job"]["environment"] == {"PATH": "/bin:/usr/bin:/usr/local/bin"}


@pytest.mark.parametrize("version", ["v0.0.40", "v0.0.41", "v0.0.42"])
def test_a_submission_from_v0_0_40_has_the_script_inside_and_tres_per_node(version):
    body = DIALECTS[version].submission(SUBMISSION)
    assert set(body) == {"job"} and body["job"]["script"] == SUBMISSION.script
    assert body["job"]["tres_per_node"] == "gres/gpu:h100:2" and "gres" not in body["job"]
    assert (body["job"]["minimum_nodes"], body["job"]["maximum_nodes"]) == (2, 2)
    assert body["job"]["environment"] == ["PATH=/bin:/usr/bin:/usr/local/bin"]
    assert body["job"]["comment"] == "tp-k" and body["job"]["partition"] == "debug"
