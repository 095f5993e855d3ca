"""The agent's reconnect backoff never exceeds a heartbeat interval: after a console outage
every node that is up is back inside the grace the console gives (at least a lease, tests of
the console-outage grace rule in test_liveness.py), and after a gateway restart within an
interval of its being ready, not a lease (issue 20)."""

import pytest

from nodes.agent.serve import BACKOFF_MAX, backoff_delay


@pytest.mark.parametrize("interval", [1, 2, 10])
def test_a_reconnect_never_waits_longer_than_the_heartbeat_interval_the_welcome_gave(interval):
    delays = [backoff_delay(attempt, interval) for attempt in range(64) for _ in range(20)]
    assert max(delays) <= interval
    assert max(delays) > interval / 2  # the cap is reached, not undercut


def test_before_any_welcome_the_cap_is_the_consoles_default_interval(settings):
    assert BACKOFF_MAX <= settings.TUNEPLANE_HEARTBEAT_INTERVAL < settings.TUNEPLANE_LEASE_TTL
    assert max(backoff_delay(attempt, 0) for attempt in range(64)) <= BACKOFF_MAX


def test_the_delay_doubles_and_is_jittered_downwards():
    first = [backoff_delay(0, 10) for _ in range(200)]
    fourth = [backoff_delay(3, 10) for _ in range(200)]
    assert min(first) >= 0.5 and max(first) <= 1.0
    assert min(fourth) >= 4.0 and max(fourth) <= 8.0
    assert len(set(fourth)) > 100  # jittered: a fleet does not come back in lockstep
