"""Preemption's rules on the boundaries mutation testing moved (issue 47; placement.preemption,
Q5, R16), without a database: a pass over several waiting requests (who preempts first, one
passed over does not stop the next, what one preemptor took is gone for the next), a gang's
rendezvous port. Each test was seen failing against the mutant it names."""

from placement.preemption import plan, victims
from placement.sharing import Book, QuotaRow
from tests.placement.test_decide import fleet, node, request
from tests.placement.test_preemption import MIN_RUNTIME, NOW, full, running

A, B, C = 1, 2, 3


def taken(chosen) -> list:
    return [(waiter.key, [job.key for job in victims]) for waiter, victims in chosen]


def test_Q5_a_pass_preempts_for_the_highest_priority_first_whatever_its_order():
    """Two requests of B within its guarantee and one borrowed job to take: the later one of
    higher priority takes it (x_plan__mutmut_17). A single-node request holds no rendezvous
    port (R16; _62)."""
    victim = running(1, A, "n", 8)
    book = Book(rows={(A, ""): QuotaRow(), (B, ""): QuotaRow(guaranteed=16)}, held={(A, ""): 8})
    early, urgent = request(1, cards=8, project=B), request(2, cards=8, project=B, priority=5)
    capacities = full("n")
    chosen = plan([early, urgent], [victim], capacities, book, NOW, MIN_RUNTIME)
    assert taken(chosen) == [(urgent.key, [victim.key])]
    assert capacities["n"].ports == set()
    assert book.held == {(A, ""): 0, (B, ""): 8}


def test_Q5_a_request_that_may_preempt_nothing_does_not_stop_the_next_from_preempting():
    """Before B's request: C's (higher priority, nothing it may take: no guarantee, no work
    of its own) and B's for 16 cards on one node (within its guarantee, but no set of
    victims fits it). Each is passed over, not the end of the pass (_23, _46)."""
    victim = running(1, A, "n", 8)
    book = Book(
        rows={(A, ""): QuotaRow(), (B, ""): QuotaRow(guaranteed=24), (C, ""): QuotaRow()},
        held={(A, ""): 8},
    )
    waiting = [
        request(1, cards=8, project=C, priority=9),
        request(2, cards=16, project=B, priority=8),
        request(3, cards=8, project=B),
    ]
    chosen = plan(waiting, [victim], full("n"), book, NOW, MIN_RUNTIME)
    assert taken(chosen) == [(("job", 3), [victim.key])]


def test_Q5_a_victims_cards_no_longer_count_against_its_quota_for_the_next_preemptor():
    """A (limit 12) holds 8 borrowed cards on n and 4 preemptible on m (m has 4 more free).
    B, within its guarantee, takes the 8 first; A's urgent request for 8 then takes its own
    4 on m: 4 held + 8 − 4 returned is within 12. Had the 8 B took still counted as A's
    (or twice), the urgent one would be over A's limit (_70)."""
    lent = running(1, A, "n", 8)
    own = running(2, A, "m", 4, borrowed=False, preemptible=True)
    book = Book(
        rows={(A, ""): QuotaRow(limit=12), (B, ""): QuotaRow(guaranteed=8)},
        held={(A, ""): 12},
    )
    reclaim = request(1, cards=8, project=B, priority=9)
    urgent = request(2, cards=8, project=A, priority=5)
    capacities = fleet(node("n", cards=0), node("m", cards=4))
    chosen = plan([reclaim, urgent], [lent, own], capacities, book, NOW, MIN_RUNTIME)
    assert taken(chosen) == [(reclaim.key, [lent.key]), (urgent.key, [own.key])]
    assert book.held == {(A, ""): 8, (B, ""): 8}


def test_R16_a_gang_that_preempts_holds_its_rendezvous_port_on_its_rank_0_node():
    """A gang of two takes A's jobs on m and n; its rank 0 is m (both free 8 then: the
    smaller id), whose first free port it holds — n already serves that port, and m's is
    what counts (_63, _64, _65, _67)."""
    jobs = [running(1, A, "m", 8), running(2, A, "n", 8)]
    capacities = full("m", "n")
    capacities["n"].ports.add(29500)
    rank_0 = capacities["m"]
    book = Book(rows={(A, ""): QuotaRow(), (B, ""): QuotaRow(guaranteed=16)}, held={(A, ""): 16})
    gang = request(9, cards=8, nodes=2, project=B)
    chosen = plan([gang], jobs, capacities, book, NOW, MIN_RUNTIME)
    assert taken(chosen) == [(gang.key, [("trainingjob", 1), ("trainingjob", 2)])]
    assert (capacities["m"].ports, capacities["n"].ports) == ({29500}, {29500})
    # The nodes the victims freed are copies: the port is held on the copy (_copied__mutmut_6).
    assert rank_0.ports == set()


def test_Q5_a_job_that_has_run_exactly_the_minimum_may_be_preempted_in_a_pass():
    """Never one that has run less than the minimum: one that has run it exactly is taken,
    by the pass as by ``victims`` (xǁ_Candidatesǁ__init____mutmut_5)."""
    victim = running(1, A, "n", 8, ran=MIN_RUNTIME)
    book = Book(rows={(A, ""): QuotaRow(), (B, ""): QuotaRow(guaranteed=8)}, held={(A, ""): 8})
    waiter = request(1, cards=8, project=B)
    assert taken(plan([waiter], [victim], full("n"), book, NOW, MIN_RUNTIME)) == [
        (waiter.key, [victim.key])
    ]


def test_Q1_Q5_a_preemptors_cards_count_against_its_series_quota_for_the_next():
    """B is guaranteed 8 H100s (and nothing of any card). Its first H100 request takes one
    borrowed job; its second would hold 16 H100s, past its guarantee, so it takes nothing —
    had the first's cards been booked to B's any-card quota, it would take the other job
    (x_plan__mutmut_81)."""
    jobs = [running(1, A, "n", 8), running(2, A, "m", 8)]
    book = Book(rows={(A, ""): QuotaRow(), (B, "h100"): QuotaRow(guaranteed=8)}, held={(A, ""): 16})
    first = request(1, cards=8, series="h100", project=B)
    second = request(2, cards=8, series="h100", project=B)
    chosen = plan([first, second], jobs, full("m", "n"), book, NOW, MIN_RUNTIME)
    assert len(chosen) == 1 and chosen[0][0] == first
    assert book.held[(B, "h100")] == 8 and (B, "") not in book.held


def test_Q5_a_projects_lowest_priority_work_is_its_lowest_whatever_the_order_it_runs_in():
    """A runs two preemptible jobs, of priority 0 then 5; its request of priority 3 takes
    the one of 0 (xǁ_Candidatesǁ__init____mutmut_13: only the last job's priority kept)."""
    low = running(1, A, "n", 8, borrowed=False, preemptible=True, priority=0)
    high = running(2, A, "m", 8, borrowed=False, preemptible=True, priority=5)
    book = Book(rows={(A, ""): QuotaRow(guaranteed=16)}, held={(A, ""): 16})
    waiter = request(1, cards=8, project=A, priority=3)
    chosen = plan([waiter], [low, high], full("n", "m"), book, NOW, MIN_RUNTIME)
    assert taken(chosen) == [(waiter.key, [low.key])]


def test_Q5_a_higher_priority_job_takes_its_projects_own_work_within_its_limit_never_past():
    """A may hold 8. It holds 8, 4 of them a preemptible job of priority 0 on n (n has 4
    more free). Its urgent request for 8 takes that job when it holds only those 4: 8 − 4 + 8
    is 12 — past 8, so never (x__within_limit__mutmut_4); when the job holds all 8 it is
    returned whole and the urgent one fits within 8 (_3, _5, _8: the returned cards counted
    from the other quotas, not at all, or added)."""
    urgent = request(1, cards=8, project=A, priority=5)
    book = Book(rows={(A, ""): QuotaRow(limit=8)}, held={(A, ""): 8})
    half = running(1, A, "n", 4, borrowed=False, preemptible=True)
    assert victims(urgent, [half], fleet(node("n", cards=4)), book, NOW, MIN_RUNTIME) is None
    whole = running(2, A, "n", 8, borrowed=False, preemptible=True)
    assert victims(urgent, [whole], full("n"), book, NOW, MIN_RUNTIME) == [whole]
