"""The agent's reconnect backoff never exceeds a lease, so after a console outage every node
that is up is back inside the grace the console gives (at least a lease, tests of the
console-outage grace rule in test_liveness.py)."""

import pytest

from nodes.agent.serve import BACKOFF_MAX, backoff_delay


@pytest.mark.parametrize("lease", [3, 6, 30])
def test_a_reconnect_never_waits_longer_than_the_lease_the_welcome_gave(lease):
    delays = [backoff_delay(attempt, lease) for attempt in range(64) for _ in range(20)]
    assert max(delays) <= lease
    assert max(delays) > lease / 2  # the cap is reached, not undercut


def test_before_any_welcome_the_cap_is_the_consoles_default_lease(settings):
    assert BACKOFF_MAX <= settings.TUNEPLANE_LEASE_TTL
    assert max(backoff_delay(attempt, 0) for attempt in range(64)) <= BACKOFF_MAX


def test_the_delay_doubles_and_is_jittered_downwards():
    first = [backoff_delay(0, 30) for _ in range(200)]
    fourth = [backoff_delay(3, 30) for _ in range(200)]
    assert min(first) >= 0.5 and max(first) <= 1.0
    assert min(fourth) >= 4.0 and max(fourth) <= 8.0
    assert len(set(fourth)) > 100  # jittered: a fleet does not come back in lockstep
