"""Why a request waits (DESIGN §8 Q8), decided by the pass that places, without a database:
one reason of a closed set with its numbers, and its place in its project's queue and the
Fleet's; every request not placed has one, none placed has one (a property)."""

import copy
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placement.decide import decide
from placement.sharing import Book, QuotaRow
from tests.placement.test_decide import NOW, fleet, node, request

A, B = 1, 2
REASONS = {
    "quota",
    "capacity",
    "fragmentation",
    "health",
    "priority",
    "fair_share",
    "backoff",
    "preempting",
    "no_devices",
    "node_unreachable",
    "cordoned",
    "fleet_closed",
}


def why(queue, capacities, book=None, unavailable=None) -> dict:
    waits: dict = {}
    decide(queue, capacities, NOW, book, waits, unavailable)
    return waits


def test_Q8_capacity_says_free_against_needed():
    [wait] = why([request(1, cards=12, series="h100")], fleet(node("n"))).values()
    assert (wait.reason, wait.numbers) == ("capacity", {"needs": 12, "free": 8})
    assert wait.message == "needs 12 h100; 8 free"


def test_Q8_fragmentation_names_the_largest_free_block_and_its_node():
    capacities = fleet(node("n", cards=4), node("m", cards=3))
    [wait] = why([request(1, cards=6)], capacities).values()
    assert wait.reason == "fragmentation"
    assert wait.numbers == {"needs": 6, "free": 7, "largest_block": 4, "node": "n"}
    assert "largest free block is 4 on n" in wait.message


def test_Q8_a_retry_in_its_backoff_says_until_when():
    later = NOW + timedelta(seconds=30)
    [wait] = why([request(1, not_before=later)], fleet(node("n"))).values()
    assert wait.reason == "backoff" and wait.numbers == {"not_before": later.isoformat()}


def test_Q8_over_its_limit_says_use_and_limit():
    book = Book(rows={(A, ""): QuotaRow(limit=8)}, held={(A, ""): 6})
    [wait] = why([request(1, cards=4, project=A)], fleet(node("n")), book).values()
    assert (wait.reason, wait.numbers) == ("quota", {"in_use": 6, "limit": 8, "needs": 4})


def test_Q8_cards_owed_to_a_waiting_guarantee_say_so():
    book = Book(rows={(A, ""): QuotaRow(), (B, ""): QuotaRow(guaranteed=8)})
    queue = [request(1, cards=8, project=B), request(2, cards=4, project=A)]
    waits = why(queue, fleet(node("n", cards=4), node("m", cards=4)), book)
    assert waits[("job", 2)].reason == "capacity" and waits[("job", 2)].numbers["owed"] == 8
    assert waits[("job", 1)].reason == "fragmentation"


def test_Q8_priority_and_fair_share_say_where_the_cards_went():
    own = [request(1, cards=8, project=A), request(2, cards=8, project=A, priority=5)]
    waits = why(own, fleet(node("n")), Book(rows={(A, ""): QuotaRow()}))
    assert waits[("job", 1)].reason == "priority" and waits[("job", 1)].numbers["ahead"] == 1
    others = [request(1, cards=8, project=A), request(2, cards=8, project=B)]
    book = Book(rows={(A, ""): QuotaRow(), (B, ""): QuotaRow()}, usage={A: 1e9})
    waits = why(others, fleet(node("n")), book)
    assert list(waits) == [("job", 1)] and waits[("job", 1)].reason == "fair_share"
    guaranteed = Book(rows={(A, ""): QuotaRow(), (B, ""): QuotaRow(guaranteed=8)})
    [wait] = why(others, fleet(node("n")), guaranteed).values()
    assert wait.reason == "capacity" and wait.numbers["guaranteed_first"] == 1
    [wait] = why(others, fleet(node("n"))).values()  # no quotas: first come
    assert wait.reason == "capacity" and wait.numbers["placed_first"] == 1


def test_Q8_cards_still_free_are_never_said_to_have_gone_ahead():
    # Two replicas of one port on one node: the second's cards are free, its port is not.
    replicas = [request(1, cards=2, port=8000), request(2, cards=2, port=8000)]
    [wait] = why(replicas, fleet(node("n"))).values()
    assert (wait.reason, wait.numbers["needs"], wait.numbers["free"]) == ("capacity", 2, 6)
    assert wait.numbers["short"] == ["port"] and "port 8000 free" in wait.message


def test_Q8_Q9_cards_the_pass_cannot_use_are_named_with_why():
    capacities = fleet(node("n", cards=2))
    for reason in ("cordoned", "health", "node_unreachable", "no_devices"):
        [wait] = why([request(1, cards=8)], copy.deepcopy(capacities), None, {reason: 8}).values()
        assert (wait.reason, wait.numbers[reason]) == (reason, 8), reason


def test_Q8_P8_cards_on_cordoned_nodes_wait_cordoned_and_quote_the_cordons_words():
    from placement.waits import NodeRow, unavailable

    placeable = fleet(node("n", cards=2))
    rows = [
        NodeRow("n", 2),
        NodeRow("c1", 4, cordons=("operator: kernel upgrade",)),
        NodeRow("c2", 4, cordons=("operator: kernel upgrade", "storage: storage root not visible")),
        NodeRow("gone", 16),
        NodeRow("leaving", 8, cordons=("operator: never quoted",), leaving=True),
        NodeRow("sick", 0, unhealthy=2, cordons=("gpu-health: every card unhealthy",)),
    ]
    found = unavailable(rows, placeable)
    assert found == {"cordoned": 8, "node_unreachable": 16, "health": 2}
    assert found.cordons == ("operator: kernel upgrade", "storage: storage root not visible")
    [wait] = why([request(1, cards=8)], copy.deepcopy(placeable), None, found).values()
    assert wait.reason == "cordoned"
    assert wait.message == (
        "needs 8 cards; 2 free, 8 more on cordoned nodes "
        "(operator: kernel upgrade; storage: storage root not visible); a storage cordon "
        "lifts by itself when its node sees the Fleet's storage root again (rule L6)"
    )
    assert wait.numbers == {
        "needs": 8,
        "free": 2,
        "cordoned": 8,
        "cordons": ["operator: kernel upgrade", "storage: storage root not visible"],
    }
    # More than the cordons fit: the nodes not connected are why.
    [wait] = why([request(1, cards=12)], copy.deepcopy(placeable), None, found).values()
    assert wait.reason == "node_unreachable" and "cordons" not in wait.numbers


def test_Q8_P8_a_leaving_node_lends_no_reason_and_many_cordons_are_cut():
    from placement.waits import NodeRow, unavailable

    rows = [NodeRow(f"c{n}", 1, cordons=(f"operator: reason {n}",)) for n in range(5)]
    found = unavailable([*rows, NodeRow("d", 8, leaving=True)], {})
    assert found == {"cordoned": 5}
    [wait] = why([request(1, cards=4)], fleet(), None, found).values()
    assert wait.message.endswith(
        "(operator: reason 0; operator: reason 1; operator: reason 2; and 2 more)"
    )
    assert unavailable([NodeRow("d", 8, leaving=True)], {}) == {}


def test_Q8_positions_in_the_project_and_the_fleet():
    queue = [
        request(1, cards=8, project=A),
        request(2, cards=8, project=B),
        request(3, cards=8, project=A, priority=2),
        request(4, cards=8, project=A),
    ]
    waits = why(queue, fleet(node("n", cards=4)), Book(rows={(A, ""): QuotaRow()}))
    assert [waits[("job", n)].position_in_project for n in (1, 2, 3, 4)] == [2, 1, 1, 3]
    assert [waits[("job", n)].position_in_fleet for n in (1, 2, 3, 4)] == [1, 2, 3, 4]


QUEUE = st.lists(
    st.tuples(st.sampled_from([A, B]), st.integers(1, 8), st.integers(0, 1), st.booleans()),
    max_size=20,
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(QUEUE, st.integers(1, 3), st.booleans())
def test_Q8_every_request_not_placed_says_why_and_none_placed_does(queue, nodes, quotas):
    requests = [
        request(
            n,
            cards=cards,
            project=project,
            priority=priority,
            not_before=NOW + timedelta(seconds=5) if later else None,
        )
        for n, (project, cards, priority, later) in enumerate(queue)
    ]
    book = Book(rows={(A, ""): QuotaRow(guaranteed=4, limit=12), (B, ""): QuotaRow()})
    waits: dict = {}
    placed = decide(
        requests,
        fleet(*(node(f"n{i}") for i in range(nodes))),
        NOW,
        book if quotas else None,
        waits,
    )
    placed_keys = {p.request.key for p in placed}
    assert placed_keys | set(waits) == {r.key for r in requests}
    assert not placed_keys & set(waits)
    for wait in waits.values():
        assert wait.reason in REASONS and wait.message and wait.position_in_fleet >= 1
