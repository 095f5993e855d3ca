"""Which running jobs a waiting request may preempt, without a database (placement.preemption;
DESIGN §8 Q4, Q5); the allocator's use of it, on the database, is test_preempting.py's.
Properties: victims only ever free what the request then fits in, every victim may be
preempted (borrowed, or preemptible) and has run its minimum, work within its guarantee is
never taken for borrowed work, and no victim is chosen twice."""

import copy
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from placement.decide import best_fit
from placement.preemption import Running, plan, victims
from placement.sharing import Book, QuotaRow
from tests.placement.test_decide import fleet, node, request

NOW = datetime(2026, 12, 7, tzinfo=UTC)
MIN_RUNTIME = 600
A, B = 1, 2


def running(n, project, node_id, cards, *, borrowed=True, preemptible=False, priority=0, ran=3600):
    held = tuple(
        {"index": 100 + n * 8 + i, "uuid": f"GPU-run-{n}-{i}", "series": "h100"}
        for i in range(cards)
    )
    return Running(
        key=("trainingjob", n),
        project=project,
        quota=(project, ""),
        borrowed=borrowed,
        preemptible=preemptible,
        priority=priority,
        started_at=NOW - timedelta(seconds=ran),
        members=((node_id, held),),
    )


def full(*nodes) -> dict:
    """Nodes whose every card is held by the running jobs: nothing free."""
    return fleet(*(node(node_id, cards=0) for node_id in nodes))


def reclaim_book(held_a=8, usage=None) -> Book:
    return Book(
        rows={(A, ""): QuotaRow(), (B, ""): QuotaRow(guaranteed=8)},
        held={(A, ""): held_a},
        usage=usage or {},
    )


def test_Q5_a_project_waiting_within_its_guarantee_preempts_borrowed_work():
    borrowed = running(1, A, "n", 8)
    chosen = victims(
        request(9, cards=8, project=B), [borrowed], full("n"), reclaim_book(), NOW, MIN_RUNTIME
    )
    assert chosen == [borrowed]


def test_Q4_work_within_its_guarantee_is_preempted_only_if_it_says_so():
    kept = running(1, A, "n", 8, borrowed=False)
    book = reclaim_book()
    assert (
        victims(request(9, cards=8, project=B), [kept], full("n"), book, NOW, MIN_RUNTIME) is None
    )
    lower = running(2, B, "n", 8, borrowed=False, priority=0)
    urgent = request(9, cards=8, project=B, priority=5)
    assert victims(urgent, [lower], full("n"), book, NOW, MIN_RUNTIME) is None
    willing = running(3, B, "n", 8, borrowed=False, preemptible=True, priority=0)
    assert victims(urgent, [willing], full("n"), book, NOW, MIN_RUNTIME) == [willing]


def test_Q5_never_a_job_that_has_run_less_than_the_minimum():
    young = running(1, A, "n", 8, ran=MIN_RUNTIME - 1)
    waiter = request(9, cards=8, project=B)
    assert victims(waiter, [young], full("n"), reclaim_book(), NOW, MIN_RUNTIME) is None


def test_Q5_only_if_the_whole_request_then_fits_and_the_fewest_victims():
    # Freeing the 2 cards on m first does not fit 4 on one node; n's 8 do, alone.
    small = running(1, A, "m", 2, ran=700)  # the youngest: tried first
    big = running(2, A, "n", 8, ran=5000)
    waiter = request(9, cards=4, project=B)
    assert victims(waiter, [small, big], full("m", "n"), reclaim_book(10), NOW, MIN_RUNTIME) == [
        big
    ]
    too_big = request(9, cards=12, project=B)  # nothing it may take makes 12 on one node
    assert (
        victims(too_big, [small, big], full("m", "n"), reclaim_book(10), NOW, MIN_RUNTIME) is None
    )


def test_Q5_a_gang_preempts_on_all_its_nodes_or_none():
    jobs = [running(1, A, "n", 8), running(2, A, "m", 8)]
    gang = request(9, cards=8, nodes=2, project=B)
    book = Book(rows={(A, ""): QuotaRow(), (B, ""): QuotaRow(guaranteed=16)}, held={(A, ""): 16})
    assert sorted(v.key for v in victims(gang, jobs, full("n", "m"), book, NOW, MIN_RUNTIME)) == [
        ("trainingjob", 1),
        ("trainingjob", 2),
    ]
    assert victims(gang, jobs[:1], full("n", "m"), book, NOW, MIN_RUNTIME) is None


def test_Q5_another_projects_work_is_never_taken_for_a_request_that_would_borrow():
    # B is guaranteed 8 and holds 4: a request for 8 more would borrow 4, so it preempts
    # nothing of A's (no oscillation: the victim could claim the cards back at once).
    book = Book(rows={(A, ""): QuotaRow(), (B, ""): QuotaRow(guaranteed=8)}, held={(B, ""): 4})
    waiter = request(9, cards=8, project=B)
    assert victims(waiter, [running(1, A, "n", 8)], full("n"), book, NOW, MIN_RUNTIME) is None


JOBS = st.lists(
    st.tuples(
        st.sampled_from([A, B]),
        st.integers(1, 8),
        st.booleans(),
        st.booleans(),
        st.integers(0, 2),
        st.integers(0, 7200),
    ),
    max_size=6,
)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(JOBS, st.integers(1, 8), st.sampled_from([A, B]), st.integers(0, 3), st.integers(1, 2))
def test_Q5_victims_free_what_the_request_fits_in_and_only_those_it_may_take(
    jobs, cards, project, priority, gang
):
    nodes = [f"n{i}" for i in range(len(jobs))]
    run = [
        running(i, owner, nodes[i], size, borrowed=lent, preemptible=willing, priority=p, ran=ran)
        for i, (owner, size, lent, willing, p, ran) in enumerate(jobs)
    ]
    held = {}
    for job in run:
        held[job.quota] = held.get(job.quota, 0) + job.cards
    book = Book(rows={(A, ""): QuotaRow(guaranteed=4), (B, ""): QuotaRow(guaranteed=8)}, held=held)
    waiter = request(99, cards=cards, nodes=gang, project=project, priority=priority)
    capacities = full(*nodes)
    chosen = victims(waiter, run, capacities, book, NOW, MIN_RUNTIME)
    if chosen is None:
        return
    assert len({job.key for job in chosen}) == len(chosen)  # none twice
    for job in chosen:
        assert job.borrowed or job.preemptible  # Q4
        assert (NOW - job.started_at).total_seconds() >= MIN_RUNTIME
        if not job.borrowed:  # work within its guarantee goes only for its own project
            assert job.project == waiter.project and job.priority < waiter.priority
        if job.project != waiter.project:  # no oscillation: the preemptor borrows nothing
            key = book.key(waiter.project, waiter.series)
            assert book.held.get(key, 0) + waiter.total_cards <= book.row(key).guaranteed
    trial = copy.deepcopy(capacities)
    for job in chosen:
        for node_id, held_cards in job.members:
            trial[node_id].free.setdefault("", []).extend(held_cards)
    assert best_fit(waiter, trial, set()) is not None  # it then fits: no preemption in vain


WAITERS = st.lists(
    st.tuples(st.sampled_from([A, B]), st.integers(1, 8), st.integers(0, 3)), max_size=4
)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(JOBS, WAITERS)
@example(  # a project's own victim returns its cards before its next preemptor reclaims
    jobs=[(A, 3, False, True, 0, 601), (B, 1, False, False, 0, 0), (B, 1, False, False, 0, 0),
          (B, 2, True, False, 0, 601)],
    waiting=[(A, 2, 0), (A, 2, 1)],
)  # fmt: skip
def test_Q5_a_pass_never_takes_a_victim_twice_nor_a_card_twice_and_each_preemptor_fits(
    jobs, waiting
):
    """``plan`` over many waiters: no job is a victim twice, no two preemptors count on one
    card, a project's preemptors together never reclaim past its guarantee, and each
    preemptor fits on what its own victims free beside what was free."""
    nodes = [f"n{i}" for i in range(len(jobs))]
    run = [
        running(i, owner, nodes[i], size, borrowed=lent, preemptible=willing, priority=p, ran=ran)
        for i, (owner, size, lent, willing, p, ran) in enumerate(jobs)
    ]
    held = {}
    for job in run:
        held[job.quota] = held.get(job.quota, 0) + job.cards
    rows = {(A, ""): QuotaRow(guaranteed=4), (B, ""): QuotaRow(guaranteed=8)}
    book = Book(rows=rows, held=dict(held))
    waiters = [
        request(100 + n, cards=cards, project=owner, priority=priority)
        for n, (owner, cards, priority) in enumerate(waiting)
    ]
    capacities = full(*nodes)
    chosen = plan(waiters, run, capacities, book, NOW, MIN_RUNTIME)
    taken = [job.key for _, victims_of in chosen for job in victims_of]
    assert len(taken) == len(set(taken))  # no victim twice
    # Every preemptor's cards, as the pass left them taken, are one card each: none twice.
    uuids = [card["uuid"] for job in run for _, cards in job.members for card in cards]
    assert len(uuids) == len(set(uuids))
    freed = {job.key for _, victims_of in chosen for job in victims_of}
    still_free = sum(len(node.free_of("")) for node in capacities.values())
    needed = sum(waiter.total_cards for waiter, _ in chosen)
    assert still_free + needed == sum(job.cards for job in run if job.key in freed)
    # Q3, Q5: a preemptor that takes another project's work stays within its guarantee, as
    # the pass has moved what its project holds so far: its own project's earlier victims
    # gave their cards back, its earlier preemptors took theirs.
    holding = {project: cards for (project, _), cards in held.items()}
    for waiter, victims_of in chosen:
        for job in victims_of:
            holding[job.project] -= job.cards
        if any(job.project != waiter.project for job in victims_of):
            guaranteed = rows[(waiter.project, "")].guaranteed
            assert holding.get(waiter.project, 0) + waiter.total_cards <= guaranteed
        holding[waiter.project] = holding.get(waiter.project, 0) + waiter.total_cards


def test_Q5_two_requests_of_one_project_reclaim_its_guarantee_once_between_them():
    jobs = [running(1, A, "n", 8), running(2, A, "m", 8)]
    waiters = [request(8, cards=8, project=B), request(9, cards=8, project=B)]
    chosen = plan(waiters, jobs, full("n", "m"), reclaim_book(held_a=16), NOW, MIN_RUNTIME)
    assert [(waiter.key, len(taken)) for waiter, taken in chosen] == [(("job", 8), 1)]
