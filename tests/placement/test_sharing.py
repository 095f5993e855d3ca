"""Sharing a node Fleet between projects, without a database (placement.decide with
placement.sharing's Book; DESIGN §8 Q3): work within its project's guarantee goes first,
borrowed work only onto cards no guarantee waits for, never past a project's limit, project
by fair share (counted as the pass places), priority then admission order within a project.
The properties hold for any queue, quotas and Fleet hypothesis makes."""

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placement.decide import decide
from placement.sharing import Book, QuotaRow, brought_forward, time_constant
from tests.placement.test_decide import NOW, fleet, node, request

A, B, C = 1, 2, 3


def book(rows=None, **fields) -> Book:
    return Book(rows=rows or {(A, ""): QuotaRow(), (B, ""): QuotaRow()}, **fields)


def keys(placements) -> list:
    return [p.request.key for p in placements]


def by_project(placements) -> dict[int, int]:
    counts: dict[int, int] = {}
    for p in placements:
        counts[p.request.project] = counts.get(p.request.project, 0) + p.request.total_cards
    return counts


def test_Q3_work_within_its_guarantee_goes_before_older_borrowed_work():
    quotas = book({(A, ""): QuotaRow(), (B, ""): QuotaRow(guaranteed=8)})
    queue = [request(1, cards=8, project=A), request(2, cards=8, project=B)]
    decided = decide(queue, fleet(node("n")), NOW, quotas)
    assert keys(decided) == [("job", 2)]
    assert (decided[0].borrowed, decided[0].quota_series) == (False, "")


def test_Q3_a_borrower_takes_no_card_a_waiting_guarantee_is_owed():
    # B is guaranteed 8 and waits for 8 on one node; the Fleet's free cards are 4 and 4.
    # A's borrowed 4-card job would leave B's guarantee short: it is not placed.
    quotas = book({(A, ""): QuotaRow(), (B, ""): QuotaRow(guaranteed=8)})
    queue = [request(1, cards=8, project=B), request(2, cards=4, project=A)]
    assert decide(queue, fleet(node("n", cards=4), node("m", cards=4)), NOW, quotas) == []
    # With no guarantee waiting, the same cards are idle and A borrows them.
    decided = decide(queue[1:], fleet(node("n", cards=4), node("m", cards=4)), NOW, quotas)
    assert keys(decided) == [("job", 2)] and decided[0].borrowed


def test_Q3_a_borrower_may_take_cards_of_another_series_than_the_one_owed():
    quotas = book({(A, ""): QuotaRow(), (B, "h100"): QuotaRow(guaranteed=8)})
    queue = [
        request(1, cards=8, series="h100", project=B),
        request(2, cards=4, series="a10", project=A),
    ]
    capacities = fleet(node("h", cards=4, series="h100"), node("a", cards=4, series="a10"))
    assert keys(decide(queue, capacities, NOW, quotas)) == [("job", 2)]


def test_Q1_Q3_a_project_never_holds_more_than_its_limit():
    quotas = book({(A, ""): QuotaRow(limit=8)}, held={(A, ""): 6})
    queue = [request(1, cards=4, project=A), request(2, cards=2, project=A)]
    decided = decide(queue, fleet(node("n")), NOW, quotas)
    assert keys(decided) == [("job", 2)]  # 6 + 4 > 8; 6 + 2 fits, and R2: it is not held up
    assert quotas.held[(A, "")] == 8


def test_Q3_borrowed_cards_go_by_fair_share_counted_as_the_pass_places():
    # Two projects with equal weight and no history, ten one-card jobs each, all of A's
    # submitted first: the eight free cards are shared four and four, not eight to A.
    queue = [request(n, project=A) for n in range(10)]
    queue += [request(n, project=B) for n in range(10, 20)]
    decided = decide(queue, fleet(node("n")), NOW, book())
    assert by_project(decided) == {A: 4, B: 4}


def test_Q3_a_weight_of_three_gets_three_cards_to_one():
    quotas = book({(A, ""): QuotaRow(weight=3), (B, ""): QuotaRow(weight=1)})
    queue = [request(n, project=A) for n in range(10)]
    queue += [request(n, project=B) for n in range(10, 20)]
    assert by_project(decide(queue, fleet(node("n")), NOW, quotas)) == {A: 6, B: 2}


def test_Q3_a_project_that_used_more_recently_waits_behind_one_that_used_less():
    tau = time_constant(7 * 86400)
    quotas = book(usage={A: 2 * tau * 1.0, B: 0.0}, tau=tau)  # A's recent average: 2 cards
    queue = [request(n, project=A) for n in range(8)]
    queue += [request(n, project=B) for n in range(8, 16)]
    assert by_project(decide(queue, fleet(node("n")), NOW, quotas)) == {A: 3, B: 5}


def test_Q3_within_a_project_priority_then_admission_order():
    queue = [
        request(1, cards=8, project=A),
        request(2, cards=8, project=A, priority=5),
        request(3, cards=8, project=A, priority=5),
    ]
    assert keys(decide(queue, fleet(node("n")), NOW, book())) == [("job", 2)]


def test_Q1_a_fleet_without_quotas_is_first_come_first_served():
    queue = [request(n, project=A) for n in range(10)]
    queue += [request(n, project=B) for n in range(10, 20)]
    assert by_project(decide(queue, fleet(node("n")), NOW, Book(rows={}))) == {A: 8}
    assert by_project(decide(queue, fleet(node("n")), NOW)) == {A: 8}


def test_Q3_use_decays_with_the_half_life_and_grows_with_what_is_held():
    tau = time_constant(100.0)
    assert abs(brought_forward(1000.0, 0, 100.0, tau) - 500.0) < 1e-6  # halved
    held = brought_forward(0.0, 2, 100.0, tau)  # two cards for a half-life
    assert 100.0 < held < 200.0  # less than 200 card-seconds: the first ones decayed
    assert brought_forward(1000.0, 3, 0.0, tau) == 1000.0


ROWS = st.dictionaries(
    st.tuples(st.sampled_from([A, B, C]), st.sampled_from(["", "h100"])),
    st.builds(
        lambda guaranteed, extra, weight: QuotaRow(
            guaranteed, None if extra is None else guaranteed + extra, weight
        ),
        st.integers(0, 8),
        st.one_of(st.none(), st.integers(0, 8)),
        st.integers(1, 3),
    ),
    min_size=1,
)
QUEUE = st.lists(
    st.tuples(
        st.sampled_from([A, B, C]),
        st.integers(1, 8),
        st.sampled_from(["", "h100"]),
        st.integers(0, 2),
    ),
    max_size=25,
)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(ROWS, QUEUE, st.integers(1, 4))
def test_Q1_Q3_no_project_past_its_limit_no_card_twice_in_quota_never_past_its_guarantee(
    rows, queue, nodes
):
    requests = [
        request(n, cards=cards, series=series, project=project, priority=priority)
        for n, (project, cards, series, priority) in enumerate(queue)
    ]
    quotas = Book(rows=rows)
    capacities = fleet(*(node(f"n{i}") for i in range(nodes)))
    decided = decide(requests, copy.deepcopy(capacities), NOW, quotas)
    cards = [(node_id, c["uuid"]) for p in decided for node_id, held in p.members for c in held]
    assert len(cards) == len(set(cards))  # R1: one holder a card
    total: dict = {}
    within: dict = {}
    for p in decided:
        key = quotas.key(p.request.project, p.request.series)
        assert p.quota_series == key[1]
        total[key] = total.get(key, 0) + p.request.total_cards
        if not p.borrowed:
            within[key] = within.get(key, 0) + p.request.total_cards
    for key, cards_held in total.items():
        limit = quotas.row(key).limit
        assert limit is None or cards_held <= limit  # Q1: never past its limit
        assert within.get(key, 0) <= quotas.row(key).guaranteed  # Q3: in-quota is in quota
        assert quotas.held.get(key, 0) == cards_held
