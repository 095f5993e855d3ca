"""The allocator's decision on the boundaries mutation testing moved (issue 47;
placement.decide), without a database: which node a request waiting past the bound keeps
for itself (R2) and which it never does, a gang whose rank 0 has no rendezvous port left
(R16). Each test was seen failing against the mutants it names."""

import pytest

from placement.decide import RENDEZVOUS_PORTS, decide
from placement.sharing import Book, QuotaRow
from tests.placement.test_decide import NOW, fleet, node, request

A, B, C = 1, 2, 3


def partly_free(node_id: str, free: int, cards: int = 8, **fields):
    """An H100 node of ``cards`` with only ``free`` of them free."""
    capacity = node(node_id, cards=cards, **fields)
    capacity.free = {series: devices[:free] for series, devices in capacity.free.items()}
    return capacity


def where(placements) -> dict:
    return {p.request.key: p.members[0][0] for p in placements}


def test_R2_one_waiting_past_the_bound_keeps_the_node_with_the_most_free_cards():
    """Neither node fits 8 now; "a" (6 free) is the closest, "b" (2 free) is not kept: a
    later request for 4 fits only "a" and waits, one for 2 starts on "b"
    (x__reserve__mutmut_10: the fewest kept; _9: the first listed; _3, _5: no order)."""
    big = request(1, cards=8, reserve=True)
    later = [request(2, cards=4), request(3, cards=2)]
    placed = decide([big, *later], fleet(partly_free("b", 2), partly_free("a", 6)), NOW)
    assert where(placed) == {("job", 3): "b"}


def test_R2_never_a_node_it_could_not_fit_once_everything_on_it_is_cleaned_up():
    """A 4-card node "s" with all 4 free has the most free cards, but never fits 8: "a"
    (3 of 8 free) is kept, and a later request for 3 starts on "s" (_6: a node it cannot
    fit kept)."""
    big = request(1, cards=8, reserve=True)
    capacities = fleet(partly_free("a", 3), partly_free("s", 4, cards=4))
    assert where(decide([big, request(2, cards=3)], capacities, NOW)) == {("job", 2): "s"}


def test_R2_H2_never_a_node_its_earlier_attempts_failed_on():
    """The closest node is one the waiting request excludes (H2): the other is kept, and a
    later request starts on the excluded one (xǁNodeCapacityǁcould_fit__mutmut_2)."""
    big = request(1, cards=8, reserve=True, excluded_nodes=frozenset({"a"}))
    capacities = fleet(partly_free("a", 6), partly_free("b", 2))
    assert where(decide([big, request(2, cards=2)], capacities, NOW)) == {("job", 2): "a"}


def test_R2_never_a_node_without_a_card_of_its_series():
    """A request for one A10 waits past the bound on a Fleet of H100s: it keeps no node, so
    a later request for any card starts (could_fit__mutmut_7: a series the node lacks read
    as one card; _4, _6: as nothing, an error)."""
    pinned = request(1, cards=1, series="a10", reserve=True)
    capacities = fleet(partly_free("a", 1))
    assert where(decide([pinned, request(2, cards=1)], capacities, NOW)) == {("job", 2): "a"}


def test_R16_a_gang_whose_rank_0_node_has_no_rendezvous_port_left_waits():
    """Every rendezvous port of its rank 0's node is in use: the gang is not placed, and the
    pass goes on (x_free_rendezvous_port__mutmut_3: no port left an error)."""
    crowded = node("a", cards=2, ports=set(RENDEZVOUS_PORTS))
    gang = request(1, cards=2, nodes=2)
    single = request(2, cards=1)
    assert where(decide([gang, single], fleet(crowded, node("b")), NOW)) == {("job", 2): "a"}


def test_Q3_borrowers_take_the_idle_cards_beyond_what_is_owed_and_not_one_more():
    """B is guaranteed 8 cards and waits for 8 on one node; the Fleet's four nodes have 4
    free each (16, none fits it). A borrows 4 at a time: twice (16 − 8 = 8 stay owed), the
    third is told the cards are owed (xǁ_Idleǁtaken__mutmut_3, _4, _5: the free cards left
    after a borrower counted wrong)."""
    book = Book(rows={(B, ""): QuotaRow(guaranteed=8)})
    waiting = [request(1, cards=8, project=B)] + [request(n, cards=4, project=A) for n in (2, 3, 4)]
    capacities = fleet(*(node(name, cards=4) for name in "klmn"))
    waits: dict = {}
    placed = decide(waiting, capacities, NOW, book, waits)
    assert sorted(p.request.key for p in placed) == [("job", 2), ("job", 3)]
    assert (waits[("job", 4)].reason, waits[("job", 4)].numbers["owed"]) == ("capacity", 8)


@pytest.mark.parametrize(("held", "owed", "borrowers_placed"), [(0, 16, 2), (12, 12, 3)])
def test_Q3_the_cards_owed_are_what_a_guarantees_waiting_work_asks_within_what_is_left_of_it(
    held, owed, borrowers_placed
):
    """B is guaranteed 24 and holds ``held``; two requests of B for 8 on one node wait
    (nodes of 4: neither fits). It is owed 16 together, or the 12 its guarantee has left
    when it holds 12. Of 24 free cards, A borrows 4 at a time while that many stay free
    (x__shared__mutmut_37, _41: the waiting requests' cards not summed, or one too many;
    _47, _49: what B holds added, or not subtracted)."""
    book = Book(rows={(B, ""): QuotaRow(guaranteed=24)}, held={(B, ""): held})
    waiting = [request(n, cards=8, project=B) for n in (1, 2)]
    borrowers = [request(n, cards=4, project=A) for n in range(3, 8)]
    capacities = fleet(*(node(f"n{i}", cards=4) for i in range(6)))
    waits: dict = {}
    placed = decide(waiting + borrowers, capacities, NOW, book, waits)
    assert [p.request.key for p in placed] == [b.key for b in borrowers[:borrowers_placed]]
    assert waits[borrowers[-1].key].numbers["owed"] == owed


@pytest.mark.parametrize("series", ["", "h100"])
def test_Q1_Q8_a_request_past_its_limit_on_a_project_holding_nothing_is_told_it_holds_0(series):
    """A may hold 4 (of ``series``, "" any card) and holds none: its request for 8 waits,
    told it holds 0 of 4 and needs 8, of its quota's series (x__shared__mutmut_87, _89:
    nothing held an error; _90: read as 1; _95: the series left out)."""
    book = Book(rows={(A, series): QuotaRow(limit=4)})
    waits: dict = {}
    waiting = [request(1, cards=8, series=series, project=A)]
    assert decide(waiting, fleet(node("n")), NOW, book, waits) == []
    told = waits[("job", 1)]
    assert (told.reason, told.numbers) == ("quota", {"in_use": 0, "limit": 4, "needs": 8})
    assert f"holds 0 of its limit of 4 {series or 'cards'} here" in told.message


@pytest.mark.parametrize(
    ("owed", "borrowed"),
    [("h100", "h100"), ("h100", ""), ("", "h100")],
    ids=["h100-owed-h100-borrower", "h100-owed-any-card-borrower", "any-card-owed-h100-borrower"],
)
def test_Q8_a_borrower_told_the_cards_are_owed_is_told_how_many_are_free(owed, borrowed):
    """B is guaranteed 8 cards (of ``owed``) and waits for 8 on one node; the Fleet's four
    nodes have 4 H100s free each. A's request for 12 (of ``borrowed``) waits: 16 free, 8 of
    them owed, in its series' words. An any-card borrower was told 0 were free when only
    H100s were owed (x__shared__mutmut_113, _114; _104, _112: the free cards not told, or
    always of any card; _107: its series left out)."""
    book = Book(rows={(B, owed): QuotaRow(guaranteed=8)})
    waiting = [
        request(1, cards=8, series=owed, project=B),
        request(2, cards=12, series=borrowed, project=A),
    ]
    waits: dict = {}
    capacities = fleet(*(node(name, cards=4) for name in "klmn"))
    assert decide(waiting, capacities, NOW, book, waits) == []
    told = waits[("job", 2)]
    assert (told.reason, told.numbers) == ("capacity", {"needs": 12, "free": 16, "owed": 8})
    assert told.message.startswith(f"needs 12 {borrowed or 'cards'}; 16 free, 8 of them owed")


def test_Q3_the_cards_owed_to_two_projects_guarantees_of_one_series_add_up():
    """B and C are guaranteed 4 cards each, and each waits for 4 on one node (nodes of 2:
    neither fits): 8 are owed. A borrower of 2 of the 8 free waits, told so
    (xǁ_Idleǁ__init____mutmut_6: only the last project's 4 counted)."""
    book = Book(rows={(B, ""): QuotaRow(guaranteed=4), (C, ""): QuotaRow(guaranteed=4)})
    waiting = [request(1, cards=4, project=B), request(2, cards=4, project=C)]
    waiting.append(request(3, cards=2, project=A))
    waits: dict = {}
    capacities = fleet(*(node(name, cards=2) for name in "klmn"))
    assert decide(waiting, capacities, NOW, book, waits) == []
    assert waits[("job", 3)].numbers == {"needs": 2, "free": 8, "owed": 8}


def test_Q3_one_card_owed_is_owed():
    """B is guaranteed 1 card and waits for it, but its earlier attempts failed on the only
    node (H2): the card is still owed, and A's request for both free cards waits
    (xǁ_Idleǁ__init____mutmut_3: a single card owed not counted)."""
    book = Book(rows={(B, ""): QuotaRow(guaranteed=1)})
    waiting = [
        request(1, cards=1, project=B, excluded_nodes=frozenset({"n"})),
        request(2, cards=2, project=A),
    ]
    waits: dict = {}
    assert decide(waiting, fleet(node("n", cards=2)), NOW, book, waits) == []
    assert waits[("job", 2)].numbers == {"needs": 2, "free": 2, "owed": 1}


def test_Q3_a_guarantee_its_own_work_filled_in_the_pass_is_owed_nothing():
    """B is guaranteed 8: its request for 8 on one node fits nowhere (nodes of 4), its gang
    of 4 on each of 2 nodes starts and fills the guarantee. A borrower of 16 (of 8 left
    free) waits for capacity, not for cards owed (xǁ_Idleǁ__init____mutmut_2: a guarantee
    owed 0 counted)."""
    book = Book(rows={(B, ""): QuotaRow(guaranteed=8)})
    waiting = [
        request(1, cards=8, project=B),
        request(2, cards=4, nodes=2, project=B),
        request(3, cards=16, project=A),
    ]
    waits: dict = {}
    capacities = fleet(*(node(name, cards=4) for name in "klmn"))
    assert [p.request.key for p in decide(waiting, capacities, NOW, book, waits)] == [("job", 2)]
    assert "owed" not in waits[("job", 3)].numbers


def test_Q8_free_cards_told_of_any_card_are_counted_once_beside_a_series_owed():
    """B is guaranteed 4 of any card and C 4 H100s, each waiting for 4 on one node (nodes
    of 2 H100s: neither fits). A's request for 6 A10s overlaps B's guarantee: it waits,
    told the 8 cards free of any card — not 16, the H100s counted twice
    (xǁ_Idleǁfree_to__mutmut_2)."""
    book = Book(rows={(B, ""): QuotaRow(guaranteed=4), (C, "h100"): QuotaRow(guaranteed=4)})
    waiting = [
        request(1, cards=4, project=B),
        request(2, cards=4, series="h100", project=C),
        request(3, cards=6, series="a10", project=A),
    ]
    waits: dict = {}
    capacities = fleet(*(node(name, cards=2) for name in "klmn"))
    assert decide(waiting, capacities, NOW, book, waits) == []
    assert waits[("job", 3)].numbers == {"needs": 6, "free": 8, "owed": 4}
