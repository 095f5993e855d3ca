"""The agent's reconnect backoff never exceeds a heartbeat interval: after a console outage
every node that is up is back inside the grace the console gives (at least a lease, tests of
the console-outage grace rule in test_liveness.py), and after a gateway restart within an
interval of its being ready, not a lease (issue 20)."""

import contextlib
import socket
import threading

import grpc
import pytest

from nodes.agent.serve import BACKOFF_MAX, CHANNEL_OPTIONS, backoff_delay


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


def test_a_handshake_that_takes_long_is_waited_for_past_grpcs_20_s():
    """After a gateway restart every node's TLS handshake arrives at once and they finish
    late, together: the agent's channel gives one a minute, not grpc's default 20 s, so
    one is not given up and begun again from nothing (issue 20). A listener that accepts
    and never answers stands in for a replica deep in such a storm; the control, a channel
    with grpc's defaults, has given up while the agent's still waits."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    accepted, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                accepted.append(listener.accept()[0])  # held open, never answered

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    target = f"127.0.0.1:{listener.getsockname()[1]}"
    credentials = grpc.ssl_channel_credentials()
    agents = grpc.secure_channel(target, credentials, options=CHANNEL_OPTIONS)
    grpcs = grpc.secure_channel(target, credentials)
    agents_call = agents.unary_unary("/probe.Probe/Call").future(b"")
    try:
        control = grpcs.unary_unary("/probe.Probe/Call").future(b"")
        assert control.exception(timeout=60).code() == grpc.StatusCode.UNAVAILABLE  # at 20 s
        assert not agents_call.done()
    finally:
        agents_call.cancel()
        for channel in (agents, grpcs):
            channel.close()
        stop.set()
        acceptor.join(5)  # out of accept() before its socket closes
        for connection in (listener, *accepted):
            connection.close()
