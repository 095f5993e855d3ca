"""Which verbs a node's admin page offers now, and why not the others (issue 49; D1–D4):
a pure decision, tested without a database."""

import pytest

from nodes.choices import SchedulingState
from nodes.node_page import VERBS, verbs_offered


def offered(state, operator_cordon=False, draining=False) -> set[str]:
    shown = verbs_offered(state, operator_cordon, draining)
    return {verb for verb, why in shown.items() if not why}


@pytest.mark.parametrize(
    ("state", "operator_cordon", "draining", "expected"),
    [
        (SchedulingState.SCHEDULABLE, False, False, {"cordon", "drain"}),
        (SchedulingState.SCHEDULABLE, True, False, {"cordon", "uncordon", "drain"}),
        (SchedulingState.DRAINING, False, True, {"cordon", "resume"}),
        (SchedulingState.DRAINING, True, True, {"cordon", "uncordon", "resume"}),
        (SchedulingState.DRAINED, False, True, {"cordon", "resume", "remove"}),
        (SchedulingState.GONE, False, False, {"cordon", "drain", "remove"}),
        # gone while draining: leaving still (a drain to undo), removable with force (D3)
        (SchedulingState.GONE, False, True, {"cordon", "resume", "remove"}),
        (SchedulingState.REMOVED, True, True, set()),
    ],
)
def test_D1_D4_the_verbs_a_node_page_offers(state, operator_cordon, draining, expected):
    assert offered(state, operator_cordon, draining) == expected


def test_each_verb_not_offered_says_why():
    for state in SchedulingState.values:
        for operator_cordon in (False, True):
            for draining in (False, True):
                shown = verbs_offered(state, operator_cordon, draining)
                assert tuple(shown) == VERBS
                assert all(isinstance(why, str) for why in shown.values())
    assert verbs_offered(SchedulingState.SCHEDULABLE, False, False)["remove"].startswith(
        "drain it first"
    )
