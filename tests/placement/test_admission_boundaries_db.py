"""Admission's refusals on the boundaries a mutant moved (issue 47), on the real database:
leaving machines named five at most, then counted, one said as one (P6, P8); a leaving node
named where it would complete a gang, exactly (P8); a pinned request refused against its
series' own limit, in its series' words, and only against its own project's quota on the
Fleets asked (Q2); a node without a card of the series asked holds none of it, not even one
(J4, P1); Fleets without nodes refuse a request in words (P6); where a request fits, of its
Fleet only, placeable ones first (P7, P8); a node listing no devices is never where a
request for cards fits, and a leaving one is named where a request for no cards would fit
it (Q9, P7, P8). Each test was seen failing against the mutants it names; the pure ones
are test_admission_boundaries.py's."""

import pytest

from nodes.choices import SchedulingState
from nodes.models import Node
from nodes.services.cordons import node_cordon
from nodes.services.drains import node_drain
from placement.admission import Need, _over_limits, admit_automatically, admit_named
from placement.services.quotas import QuotaSpec, quotas_replace
from tests.conftest import H100_INVENTORY, SYSTEM, placeable_node
from tests.placement.test_p8_coming_back import JOB, refused
from tests.placement.test_quotas import QUOTAS
from tuneplane.errors import PlacementRefused

RESUME = (
    "A draining or drained machine takes no new work until an administrator resumes it "
    "(rules D1, P8)."
)


def test_P8_leaving_nodes_are_named_five_at_most_then_counted(node_fleet, gpu_node, member_api):
    """Six leaving: five named in order of id and one more; five: all named, none more
    (xǁHoldingsǁleaving__mutmut_70–_75: the count said otherwise, from five on; _76, _78,
    _81–_84: several said as one)."""
    nodes = [gpu_node(node_fleet, address=f"10.0.0.{n}:1") for n in range(1, 7)]
    for node in nodes:
        node_drain(actor=SYSTEM, node=node, reason="rack 4")
    ids = sorted(node.id for node in nodes)
    named = ", ".join(f"{id} (drained: rack 4)" for id in ids[:5])
    assert refused(member_api).endswith(
        f" 6 nodes that would fit are leaving: {named} and 1 more. {RESUME}"
    )
    Node.objects.filter(pk=ids[5]).update(scheduling_state=SchedulingState.REMOVED)
    assert refused(member_api).endswith(f" 5 nodes that would fit are leaving: {named}. {RESUME}")


def test_P8_a_leaving_node_that_would_complete_a_gang_is_named_exactly(
    node_fleet, two_nodes, member_api
):
    """One node fits, one is leaving: a gang of two is refused naming it (1 + 1 nodes,
    xǁHoldingsǁleaving__mutmut_63, _64), as one node (_77, _79, _80); a gang of three is
    not, the leaving one counted once (_60, _61), and nothing is said of it (_66). Both
    leaving: a gang of two is refused naming both, counted per Fleet (_56)."""
    leaving = node_drain(actor=SYSTEM, node=two_nodes[1], reason="rma")
    assert refused(member_api, {**JOB, "nodes": 2}).endswith(
        f" 1 node that would fit is leaving: {leaving.id} (drained: rma). {RESUME}"
    )
    assert refused(member_api, {**JOB, "nodes": 3}).endswith(
        "; largest fit: 8 × cards on one node in gpu-lab."
    )
    other = node_drain(actor=SYSTEM, node=two_nodes[0], reason="rma")
    named = ", ".join(f"{id} (drained: rma)" for id in sorted([leaving.id, other.id]))
    assert refused(member_api, {**JOB, "nodes": 2}).endswith(
        f" 2 nodes that would fit are leaving: {named}. {RESUME}"
    )


def test_Q2_a_pinned_request_is_refused_against_its_series_limit_in_its_words(
    node_fleet, gpu_node, admin_api, member_api
):
    """A series quota of its own counts, not the any-card one, and is said by its series
    (x__over_limits__mutmut_44); without one, the any-card quota counts
    (x__over_limits__mutmut_14: the any-card row never read for a pinned request)."""
    gpu_node(node_fleet)
    quotas = [{"project": "ml"}, {"project": "ml", "series": "h100", "limit": 4}]
    admin_api.request("PUT", QUOTAS, {"quotas": quotas})
    response = member_api.post("/api/training-jobs", {**JOB, "series": "h100", "cards": 8})
    assert response.status_code == 422, response.content
    assert response.json()["error"]["message"] == (
        "project ml may hold at most 4 h100 on gpu-lab; this asks 8 (rule Q2)."
    )
    assert member_api.post("/api/training-jobs", {**JOB, "cards": 8}).status_code == 201
    admin_api.request("PUT", QUOTAS, {"quotas": [{"project": "ml", "limit": 4}]})
    response = member_api.post("/api/training-jobs", {**JOB, "series": "h100", "cards": 8})
    assert response.status_code == 422, response.content
    assert response.json()["error"]["message"] == (
        "project ml may hold at most 4 cards on gpu-lab; this asks 8 (rule Q2)."
    )


def test_J4_P1_a_node_without_the_series_asked_holds_none_of_it_not_even_one(
    node_fleet, gpu_node, member_api
):
    """x__cards_counted__mutmut_19: a series missing from a node's cards counted as 1."""
    gpu_node(node_fleet)  # eight h100, no h200
    response = member_api.post("/api/training-jobs", {**JOB, "series": "h200", "cards": 1})
    assert response.status_code == 422, response.content
    assert response.json()["error"]["best_offer"] == ("no node of a Fleet you can see holds h200")


def test_Q2_only_the_projects_own_quota_on_the_fleets_asked_limits_it(
    node_fleet, make_fleet, project, vision
):
    """x__over_limits__mutmut_11 (every project's quotas read as the requester's), _12
    (every Fleet's quotas read)."""
    other = make_fleet("other-lab", capabilities=["train"])
    quotas_replace(actor=SYSTEM, fleet=node_fleet, specs=[QuotaSpec(project="cv", limit=4)])
    quotas_replace(actor=SYSTEM, fleet=other, specs=[QuotaSpec(project="ml", limit=4)])
    need = Need("train", cards=8)
    assert _over_limits(project, [node_fleet.id], need) == {}
    assert _over_limits(project, [node_fleet.id, other.id], need) == {
        "other-lab": "project ml may hold at most 4 cards on other-lab; this asks 8 (rule Q2)."
    }


def test_Q9_P7_a_node_listing_no_devices_is_never_where_a_request_fits(
    node_fleet, gpu_node, mint, project
):
    """The admission records the nodes that fit: a node counting eight cards but listing no
    devices holds none, not one (xǁHoldingsǁ__init____mutmut_33); a request for no cards,
    as one naming an image may be, fits it, holding 0, not null (_25, _27, _32)."""
    listed = gpu_node(node_fleet, container_runtime="docker")
    unlisted = {**H100_INVENTORY, "container_runtime": "docker"}  # cards, no devices
    bare = placeable_node(mint, node_fleet, unlisted, "10.0.0.9:1")
    assert admit_named(project, node_fleet.id, Need("train", cards=1)).nodes == [listed.id]
    image = Need("train", cards=0, container=True)
    assert admit_named(project, node_fleet.id, image).nodes == [listed.id, bare.id]


def test_P8_a_leaving_node_listing_no_devices_is_named_for_a_request_of_no_cards(
    node_fleet, mint, project
):
    """It holds 0 cards, not null (xǁHoldingsǁleaving__mutmut_15, _17, _23): a request
    naming an image and no cards would fit it; not 1 (_24): one asking a card would not."""
    bare = placeable_node(
        mint, node_fleet, {**H100_INVENTORY, "container_runtime": "docker"}, "10.0.0.9:1"
    )
    node_drain(actor=SYSTEM, node=bare, reason="rma")
    with pytest.raises(PlacementRefused) as raised:
        admit_named(project, node_fleet.id, Need("train", cards=0, container=True))
    assert f" 1 node that would fit is leaving: {bare.id} (drained: rma). " in str(raised.value)
    with pytest.raises(PlacementRefused) as raised:
        admit_named(project, node_fleet.id, Need("train", cards=1, container=True))
    assert "is leaving" not in str(raised.value)


def test_P7_P8_where_a_request_fits_is_its_fleets_nodes_placeable_ones_first(
    node_fleet, make_fleet, gpu_node, project
):
    """The chosen Fleet's nodes only (xǁHoldingsǁfitting_nodes__mutmut_30: every candidate
    Fleet's), a node placeable now before a cordoned one with more cards (_25)."""
    cordoned = gpu_node(node_fleet, address="10.0.0.1:1")
    node_cordon(actor=SYSTEM, node=cordoned, reason="firmware")
    placeable = gpu_node(node_fleet, cards=4, address="10.0.0.2:1")
    gpu_node(make_fleet("other-lab", capabilities=["train"]), cards=2, address="10.0.0.3:1")
    admitted = admit_automatically(project, Need("train", cards=2))
    assert (admitted.fleet_id, admitted.nodes) == (node_fleet.id, [placeable.id, cordoned.id])


def test_P6_fleets_without_a_node_refuse_a_request_in_words(make_fleet, project):
    """Each Fleet's fit names its Fleet even with no node counted
    (xǁHoldingsǁper_fleet__mutmut_2: two unnamed fits compared, a TypeError)."""
    for fleet_id in ("a-lab", "b-lab"):
        make_fleet(fleet_id, capabilities=["train"])
    with pytest.raises(PlacementRefused) as raised:
        admit_automatically(project, Need("train", cards=1))
    assert raised.value.details["best_offer"] == "no node of a Fleet you can see holds cards"
