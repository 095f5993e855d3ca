"""H6, H7's decisions as pure functions (nodes/quarantine.py), without a database: the
breaker's limit and its boundaries (exactly at the share, one card, no card, the window's
edge, a reset), and a property over sequences of faults — within any window between two
resets, automatic quarantine never passes the limit. The database's side is
tests/nodes/test_h6_h7_quarantine.py."""

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from nodes import quarantine
from nodes.quarantine import breaker_decide, breaker_limit, in_window

T0 = datetime(2026, 1, 1, tzinfo=UTC)
WINDOW = timedelta(seconds=600)


def test_H7_the_limit_is_the_share_rounded_down_but_one_card_always_and_none_of_none():
    assert breaker_limit(10, 0.2) == 2
    assert breaker_limit(14, 0.2) == 2
    assert breaker_limit(15, 0.2) == 3
    assert breaker_limit(100, 0.29) == 29  # exact: 0.29 * 100 is 28.999… in binary
    assert breaker_limit(4, 0.2) == 1  # one card may always be quarantined
    assert breaker_limit(1, 0.2) == 1
    assert breaker_limit(0, 0.2) == 0
    assert breaker_limit(8, 1) == 8
    assert breaker_limit(8, 0) == 1


def test_H7_exactly_at_the_share_quarantines_one_more_trips():
    at_share = breaker_decide(tripped=False, total_cards=10, counted=1, faults=1, share=0.2)
    assert at_share == quarantine.Decision(1, False)  # 2 of 10: exactly 20 %, allowed
    past = breaker_decide(tripped=False, total_cards=10, counted=2, faults=1, share=0.2)
    assert past == quarantine.Decision(0, True)


def test_H7_a_burst_quarantines_up_to_the_limit_and_trips_on_the_rest():
    assert breaker_decide(
        tripped=False, total_cards=10, counted=0, faults=5, share=0.2
    ) == quarantine.Decision(2, True)


def test_H7_a_tripped_breaker_quarantines_nothing_and_trips_no_more():
    assert breaker_decide(
        tripped=True, total_cards=100, counted=0, faults=1, share=0.2
    ) == quarantine.Decision(0, False)


def test_H7_one_card_and_no_card():
    one = breaker_decide(tripped=False, total_cards=1, counted=0, faults=1, share=0.2)
    assert one == quarantine.Decision(1, False)
    none = breaker_decide(tripped=False, total_cards=0, counted=0, faults=1, share=0.2)
    assert none == quarantine.Decision(0, True)
    assert breaker_decide(
        tripped=False, total_cards=0, counted=0, faults=0, share=0.2
    ) == quarantine.Decision(0, False)


def test_H7_the_windows_edge_and_a_reset():
    now = T0 + timedelta(hours=1)
    edge = [now - WINDOW, now - WINDOW + timedelta(seconds=1), now]
    assert in_window(edge, now, WINDOW) == 2  # exactly a window old has left it
    assert in_window(edge, now, WINDOW, since=now - timedelta(seconds=1)) == 1
    assert in_window(edge, now, WINDOW, since=now) == 1  # from the reset on, itself included


def test_H6_on_card_fault_defaults_stop_for_training_continue_for_serving_else_the_fleets():
    assert quarantine.on_card_fault({}, serving=False) == "stop"
    assert quarantine.on_card_fault({}, serving=True) == "continue"
    assert quarantine.on_card_fault({"on_card_fault": "continue"}, serving=False) == "continue"
    assert quarantine.on_card_fault({"on_card_fault": "stop"}, serving=True) == "stop"


def test_H6_a_card_returns_after_its_passes_and_the_quiet():
    quiet = timedelta(seconds=30)
    assert quarantine.health_returns_after({}) == 2
    assert quarantine.health_returns_after({"health_returns_after": 5}) == 5
    assert not quarantine.returns(passes=1, needed=2, quiet_for=quiet, quiet=quiet)
    assert quarantine.returns(passes=2, needed=2, quiet_for=quiet, quiet=quiet)
    assert not quarantine.returns(passes=9, needed=2, quiet_for=quiet / 2, quiet=quiet)


events = st.lists(
    st.tuples(
        st.integers(0, 400),  # seconds since the last event
        st.integers(0, 6),  # faults at once
        st.booleans(),  # an operator resets the breaker first
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(
    total=st.integers(0, 60),
    share=st.sampled_from([0, 0.05, 0.2, 0.5, 1]),
    sequence=events,
)
def test_H7_property_automatic_quarantine_never_passes_the_limit_within_a_window(
    total, share, sequence
):
    """As health.py drives it: each batch of faults asks with the quarantines counted in the
    window since the last reset; in every window between two resets, at most the limit."""
    limit = breaker_limit(total, share)
    now, tripped, reset_at = T0, False, None
    taken: list[datetime] = []
    segments: list[list[datetime]] = [[]]
    for gap, faults, reset in sequence:
        now += timedelta(seconds=gap)
        if reset and tripped:
            tripped, reset_at = False, now
            segments.append([])
        counted = in_window(taken, now, WINDOW, since=reset_at)
        decision = breaker_decide(
            tripped=tripped, total_cards=total, counted=counted, faults=faults, share=share
        )
        assert 0 <= decision.quarantine <= faults
        taken += [now] * decision.quarantine
        segments[-1] += [now] * decision.quarantine
        tripped = tripped or decision.trips
        if decision.trips:
            assert decision.quarantine < faults  # it trips only on a fault it refused
    for segment in segments:
        for end in segment:
            assert sum(1 for at in segment if end - WINDOW < at <= end) <= limit
