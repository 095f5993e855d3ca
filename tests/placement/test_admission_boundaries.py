"""Admission's words and numbers (placement.admission) on the boundaries a mutant moved
(issue 47), without a database: what a need is said as (P6), a Fleet fitting with exactly
as many nodes as asked (P1, P8), the largest fit offered among those seen (P6), a refusal
for an image naming the runtime (P6), Q9's nodes without devices said by Fleet and by
count, and what an admission records (P7). Each test was seen failing against the mutants
it names."""

import pytest

from placement.admission import (
    Admitted,
    FleetFit,
    Holdings,
    Need,
    _best_offer,
    _refuse,
    _without_runtime,
)


def holdings_for(need: Need) -> Holdings:
    """The part of Holdings that words a refusal reads only its need."""
    holdings = Holdings.__new__(Holdings)
    holdings.need = need
    return holdings


@pytest.mark.parametrize(
    ("need", "said"),
    [
        (Need("train", cards=8), "8 × any card on one node"),
        (Need("train", series="h100", cards=4), "4 × h100 on one node"),
        (Need("train", series="h100", cards=4, nodes=2), "4 × h100 on each of 2 nodes"),
    ],
)
def test_P6_a_need_is_said_with_its_series_and_its_nodes(need, said):
    """xǁNeedǁdescribe__mutmut_1–_11: one node said as one, two as each of two."""
    assert need.describe() == said


@pytest.mark.parametrize("nodes", [1, 2])
def test_P1_P8_a_fleet_fits_with_exactly_as_many_fitting_nodes_as_asked(nodes):
    """xǁFleetFitǁfits__mutmut_1, fits_now__mutmut_1: the boundary is inclusive."""
    need = Need("train", cards=8, nodes=nodes)
    fit = FleetFit("gpu-lab", largest=8, fitting_count=nodes, fitting_now=nodes)
    assert fit.fits(need) and fit.fits_now(need)
    short = FleetFit("gpu-lab", largest=8, fitting_count=nodes - 1, fitting_now=nodes - 1)
    assert not short.fits(need) and not short.fits_now(need)


def test_P7_an_admission_records_its_fleet_its_gates_and_eight_nodes_at_most():
    """xǁAdmittedǁas_record__mutmut_1–_7: nine nodes fit, the first eight are recorded."""
    nodes = [f"n{n}" for n in range(9)]
    assert Admitted("gpu-lab", ["visibility"], nodes).as_record() == {
        "fleet": "gpu-lab",
        "gates": ["visibility"],
        "fits_on": nodes[:8],
    }


def test_P6_the_best_offer_is_the_largest_fit_the_first_fleet_by_id_among_equals():
    """x__best_offer__mutmut_1–_8, _16–_18: the largest, not the smallest nor the first;
    among equals the smallest id; cards or the series asked."""
    fits = {
        "c": FleetFit("c", largest=4),
        "b": FleetFit("b", largest=6),
        "a": FleetFit("a", largest=2),
        "d": FleetFit("d", largest=6),
    }
    assert _best_offer(fits, Need("train", cards=8)) == ("largest fit: 6 × cards on one node in b")
    assert _best_offer(fits, Need("train", series="h100", cards=8)) == (
        "largest fit: 6 × h100 on one node in b"
    )


@pytest.mark.parametrize(
    ("fits", "series", "said"),
    [
        ({}, "", "no node of a Fleet you can see holds cards"),
        ({"a": FleetFit("a", largest=0)}, "h100", "no node of a Fleet you can see holds h100"),
        ({"a": FleetFit("a", largest=1)}, "", "largest fit: 1 × cards on one node in a"),
    ],
)
def test_P6_no_fit_at_all_is_said_as_none_one_card_as_a_fit(fits, series, said):
    """x__best_offer__mutmut_9–_15: no Fleet, or none holding a card; one card is a fit."""
    assert _best_offer(fits, Need("train", series=series, cards=8)) == said


def test_P6_a_refusal_for_an_image_says_the_runtime_may_be_what_it_lacked():
    """x__without_runtime__mutmut_1–_3."""
    assert _without_runtime(Need("train", cards=1), "No fit.") == "No fit."
    assert _without_runtime(Need("train", cards=1, container=True), "No fit.") == (
        "No fit. It names an image: there is no node with a container runtime "
        "(docker or podman) that fits it."
    )


def test_P6_a_refusal_carries_its_message_its_reason_and_its_details():
    """x__refuse__mutmut_1–_5."""
    refused = _refuse("quota", "too many", best_offer="none")
    assert (refused.message, refused.reason) == ("too many", "quota")
    assert refused.as_body()["error"] == {
        "code": "placement_refused",
        "message": "too many",
        "reason": "quota",
        "best_offer": "none",
    }


def test_Q9_nodes_without_devices_are_said_by_fleet_and_count_where_they_would_fit():
    """xǁHoldingsǁwithout_devices__mutmut_1–_33: one node said as one, more with the most
    cards one reports, Fleets in order of id, joined by "; ", the first letter raised; a
    Fleet they would not make fit (1 fitting + 1 unlisted < 3 nodes; exactly as many is a
    fit) and a Fleet without them left out."""
    need = Need("train", series="h100", cards=8, nodes=2)
    fits = {
        "z": FleetFit("z", fitting_count=1, unlisted=2, unlisted_cards=8),
        "b": FleetFit("b", fitting_count=1, unlisted=1, unlisted_cards=8),
        "c": FleetFit("c", fitting_count=2),
    }
    assert holdings_for(need).without_devices(fits) == (
        " A node of b reports 8 h100 but no devices; 2 nodes of z report up to 8 h100 but"
        " no devices: the agent's inventory must list each card's index and uuid"
        ' ("devices", as tuneplane-node reports them from nvidia-smi), or its node counts'
        " toward no fit (rule Q9)."
    )
    three = Need("train", cards=8, nodes=3)
    assert holdings_for(three).without_devices(fits) == (
        " 2 nodes of z report up to 8 cards but no devices: the agent's inventory must list"
        ' each card\'s index and uuid ("devices", as tuneplane-node reports them from'
        " nvidia-smi), or its node counts toward no fit (rule Q9)."
    )
    assert holdings_for(Need("train", cards=8, nodes=4)).without_devices(fits) == ""
