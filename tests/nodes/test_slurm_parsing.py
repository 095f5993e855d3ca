"""How slurmrestd's node fields read as machines (DESIGN.md §6), for the shapes a one-node
test cluster does not produce: several GPU types, index lists with commas, v0.0.36's null
state_flags, down and not-responding nodes."""

import pytest

from nodes.backends.slurm import gres_cards, scheduling_state_of


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
