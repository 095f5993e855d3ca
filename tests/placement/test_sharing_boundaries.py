"""Sharing's rules on the boundaries a targeted break moved (issue 47), without a database:
an any-card borrower against a guarantee of one series (Q3), two victims differing only in
age (Q5). Each of these passed every test when its rule's code was broken by hand."""

from datetime import timedelta

import pytest

from placement.decide import decide
from placement.preemption import victims
from placement.sharing import Book, QuotaRow, brought_forward, time_constant
from tests.placement.test_decide import NOW, fleet, node, request
from tests.placement.test_preemption import MIN_RUNTIME, full, reclaim_book, running
from tests.placement.test_preemption import NOW as RUNNING_NOW

A, B = 1, 2


@pytest.mark.parametrize(
    ("owed", "borrowed"),
    [("h100", ""), ("", "h100"), ("h100", "h100"), ("", "")],
    ids=["h100-owed-any-card-borrower", "any-card-owed-h100-borrower", "same-series", "any-card"],
)
def test_Q3_a_borrower_whose_cards_overlap_a_waiting_guarantee_takes_none_it_is_owed(
    owed, borrowed
):
    """B is guaranteed 8 cards (of ``owed``, "" any) and waits for 8 on one node; the Fleet's
    free H100s are 4 and 4. A borrower asking 4 cards of ``borrowed`` would take cards B is
    owed: an H100 is any card too, so a series and any card overlap either way."""
    quotas = Book(rows={(A, ""): QuotaRow(), (B, owed): QuotaRow(guaranteed=8)})
    queue = [
        request(1, cards=8, series=owed, project=B),
        request(2, cards=4, series=borrowed, project=A),
    ]
    waits: dict = {}
    capacities = fleet(node("n", cards=4), node("m", cards=4))
    assert decide(queue, capacities, NOW, quotas, waits) == []
    told = waits[("job", 2)]  # Q8: the borrower is told the cards are owed
    assert (told.reason, told.numbers["owed"], told.numbers["needs"]) == ("capacity", 8, 4)
    # Without the guarantee waiting, the same cards are idle and it borrows them.
    capacities = fleet(node("n", cards=4), node("m", cards=4))
    [placed] = decide(queue[1:], capacities, NOW, quotas)
    assert placed.request.key == ("job", 2) and placed.borrowed


@pytest.mark.parametrize("first", ["old", "young"])
def test_Q5_of_two_victims_differing_only_in_age_the_youngest_is_taken(first):
    """Both borrowed, same project, priority and cards; one has run 50,000 s, the other
    700 s (past the minimum): the 700 s one is taken, whichever comes first in the list."""
    old = running(1, A, "n", 8, ran=50_000)
    young = running(2, A, "m", 8, ran=700)
    pool = [old, young] if first == "old" else [young, old]
    waiter, book = request(9, cards=8, project=B), reclaim_book(held_a=16)
    taken = victims(waiter, pool, full("n", "m"), book, RUNNING_NOW, MIN_RUNTIME)
    assert taken == [young]
    assert young.started_at - old.started_at == timedelta(seconds=49_300)


def test_Q1_a_pinned_request_counts_against_its_series_quota_else_its_any_card_one():
    """A project with only an any-card quota: its H100 request counts against that quota
    (and its limit), never against a quota of its own with no limit."""
    any_card = Book(rows={(A, ""): QuotaRow(limit=4)})
    assert any_card.key(A, "h100") == (A, "") and any_card.key(A, "") == (A, "")
    pinned = Book(rows={(A, ""): QuotaRow(limit=4), (A, "h100"): QuotaRow(limit=8)})
    assert pinned.key(A, "h100") == (A, "h100") and pinned.key(A, "a10") == (A, "")
    queue = [request(1, cards=8, series="h100", project=A)]
    assert decide(queue, fleet(node("n")), NOW, any_card) == []  # 8 past the limit of 4


def test_Q3_use_grows_from_the_first_second_and_a_project_that_never_ran_has_no_share():
    tau = time_constant(7 * 86400)
    assert brought_forward(0.0, 8, 0.5, tau) > 0  # half a second of 8 cards counts
    assert brought_forward(100.0, 8, 0, tau) == 100.0
    assert Book(rows={(A, ""): QuotaRow()}).share((A, "")) == 0.0
