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


def decide(*, counted=0, faults=1, tripped=False, total_cards=10, share=0.2):
    """Faults on new cards, with ``counted`` other cards in the window."""
    return breaker_decide(
        tripped=tripped,
        total_cards=total_cards,
        counted={("old", n) for n in range(counted)},
        faults=[("new", n) for n in range(faults)],
        share=share,
    )


def test_H7_exactly_at_the_share_quarantines_one_more_trips():
    assert decide(counted=1) == quarantine.Decision((("new", 0),), False)  # 2 of 10: 20 %
    assert decide(counted=2) == quarantine.Decision((), True)


def test_H7_a_burst_quarantines_up_to_the_limit_and_trips_on_the_rest():
    assert decide(faults=5) == quarantine.Decision((("new", 0), ("new", 1)), True)


def test_H7_a_tripped_breaker_quarantines_nothing_and_trips_no_more():
    assert decide(tripped=True, total_cards=100) == quarantine.Decision((), False)


def test_H7_one_card_and_no_card():
    assert decide(total_cards=1) == quarantine.Decision((("new", 0),), False)
    assert decide(total_cards=0) == quarantine.Decision((), True)
    assert decide(total_cards=0, faults=0) == quarantine.Decision((), False)


def test_H7_a_card_counted_in_the_window_is_quarantined_again_without_taking_room():
    again = breaker_decide(
        tripped=False, total_cards=10, counted={"a", "b"}, faults=["b", "c", "b"], share=0.2
    )
    assert again == quarantine.Decision(("b",), True)


def test_H7_the_windows_edge_and_a_reset():
    now = T0 + timedelta(hours=1)
    edge = [(now - WINDOW, "a"), (now - WINDOW + timedelta(seconds=1), "b"), (now, "c")]
    assert in_window(edge, now, WINDOW) == {"b", "c"}  # exactly a window old has left it
    assert in_window(edge, now, WINDOW, since=now - timedelta(seconds=1)) == {"c"}
    assert in_window(edge, now, WINDOW, since=now) == {"c"}  # from the reset on, itself included
    assert in_window([(now, "c"), (now, "c")], now, WINDOW) == {"c"}  # one card, once


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
        st.lists(st.integers(0, 59), max_size=6),  # the cards that fail at once
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
    """As health.py drives it: each batch of faults asks with the cards counted in the window
    since the last reset; in every window between two resets, at most the limit of cards."""
    limit = breaker_limit(total, share)
    now, tripped, reset_at = T0, False, None
    taken: list[tuple] = []
    segments: list[list[tuple]] = [[]]
    for gap, cards, reset in sequence:
        now += timedelta(seconds=gap)
        if reset and tripped:
            tripped, reset_at = False, now
            segments.append([])
        cards = [card for card in cards if card < total]
        decision = breaker_decide(
            tripped=tripped,
            total_cards=total,
            counted=in_window(taken, now, WINDOW, since=reset_at),
            faults=cards,
            share=share,
        )
        assert set(decision.quarantine) <= set(cards)
        taken += [(now, card) for card in decision.quarantine]
        segments[-1] += [(now, card) for card in decision.quarantine]
        tripped = tripped or decision.trips
        if decision.trips:
            assert set(decision.quarantine) < set(cards)  # it trips only on a card it refused
    for segment in segments:
        for end, _ in segment:
            assert len({card for at, card in segment if end - WINDOW < at <= end}) <= limit
