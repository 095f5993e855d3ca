"""A1 for control sessions (nodes.services.sessions): one opened, one replacing an older
stream, one closed, and the batched forms a gateway replica uses — many Hellos answered by
one call (one of them refused, one replacing a stream, one with commands to settle), many
closes at once. Merged into SCENARIOS by test_audit_completeness."""

from django.utils import timezone

from nodes.models import ControlSession
from nodes.services import commands, sessions
from nodes.services.commands import Reported
from nodes.services.sessions import Hello

from . import node_scenarios as nodes
from .scenarios import Scenario, changed, created

READS = {
    "nodes.services.sessions.credential_refusal",  # a predicate
    "nodes.services.sessions.authenticated_node",  # a row lock, after checks
    "nodes.services.sessions.lease_until",  # a pure computation
}


def sessions_open(w):
    """Three Hellos: a node's first stream, a node's second (replacing its first, with a
    finished command to record), and one whose credential is not the node's."""
    first = w.joined()
    live = w.live()
    command = w.command(live.node, "running")
    stranger = w.joined()
    hellos = [
        Hello(first.node.id, first.certificate.serial, "0.9"),
        Hello(
            live.node_id,
            live.node.credentials.get().serial,
            "0.9",
            [Reported(command.id, "succeeded", 0)],
        ),
        Hello(stranger.node.id, "not-its-serial"),
    ]

    def call():
        answers = sessions.sessions_open(hellos=hellos, gateway="gw-2")
        assert isinstance(answers[stranger.node.id], sessions.SessionRefused)

    return call


def sessions_close(w):
    ended = {str(w.live().id): "stream ended", str(w.live().id): "lease expired"}
    return lambda: sessions.sessions_close(ended=ended)


def sessions_close_matching(w):
    session = w.live()
    matching = ControlSession.objects.filter(pk=session.pk)
    return lambda: sessions.sessions_close_matching(matching, "gateway restarted", timezone.now())


def nodes_commands_reconcile(w):
    """Two nodes' Hellos: one finished a command offline, one forgot one it was running."""
    node, other = w.node(), w.node()
    finished, forgotten = w.command(node, "running"), w.command(other, "running")
    report = {node.id: [Reported(finished.id, "failed", 3)], other.id: []}
    assert forgotten.state == "running"
    return lambda: commands.nodes_commands_reconcile(reported=report)


SCENARIOS = {
    "nodes.services.sessions.session_open": Scenario(
        nodes.session_open, (created("control_session.opened"),)
    ),
    # "a newer stream replaces an older one (its session is closed)": two sessions change.
    "nodes.services.sessions.session_open/replacing-a-stream": Scenario(
        nodes.session_open_replacing,
        (changed("control_session.closed"), created("control_session.opened")),
    ),
    "nodes.services.sessions.session_close": Scenario(
        nodes.session_close, (changed("control_session.closed"),)
    ),
    # One event per session opened or replaced and per command moved; none for the refused.
    "nodes.services.sessions.sessions_open": Scenario(
        sessions_open,
        (
            created("control_session.opened"),
            changed("control_session.closed"),
            created("control_session.opened"),
            changed("node_command.succeeded"),
        ),
    ),
    "nodes.services.sessions.sessions_close": Scenario(
        sessions_close,
        (changed("control_session.closed"), changed("control_session.closed")),
    ),
    "nodes.services.sessions.sessions_close_matching": Scenario(
        sessions_close_matching, (changed("control_session.closed"),)
    ),
    "nodes.services.commands.nodes_commands_reconcile": Scenario(
        nodes_commands_reconcile, (changed("node_command.failed"), changed("node_command.lost"))
    ),
}
