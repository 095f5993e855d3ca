"""The shapes of command payloads the console sends to nodes, checked before a command is
written: a ``run`` command's argv, a member's start, a stop's or cleanup's member."""

from nodes.agent.wire import MemberSpec, Refused
from tuneplane.errors import ValidationFailed

MAX_ARGV = 64
MAX_ARG_CHARS = 4096


def run_payload(payload) -> dict:
    if not isinstance(payload, dict) or set(payload) != {"argv"}:
        raise ValidationFailed('payload of a run command must be {"argv": [...]}.', field="payload")
    argv = payload["argv"]
    if (
        not isinstance(argv, list)
        or not 1 <= len(argv) <= MAX_ARGV
        or not all(isinstance(arg, str) and len(arg) <= MAX_ARG_CHARS for arg in argv)
        or not argv[0]
    ):
        raise ValidationFailed(
            f"payload.argv must be 1 to {MAX_ARGV} strings, the first naming the program.",
            field="payload.argv",
        )
    return {"argv": argv}


def member_payload(payload) -> dict:
    """What placement's allocator asks a node to run, read as the agent will read it
    (``MemberSpec.parse``): a start the agent would refuse is never written."""
    try:
        spec = MemberSpec.parse(payload)
    except Refused as refused:
        raise ValidationFailed(f"payload of a start command: {refused}.", field="payload") from None
    if spec.argv:
        run_payload({"argv": list(spec.argv)})
    if not all(card.uuid for card in spec.cards):
        raise ValidationFailed("payload.cards must be [{index, uuid}, ...].", field="payload.cards")
    return payload


def member_ref_payload(payload) -> dict:
    if not isinstance(payload, dict) or not isinstance(payload.get("member"), str):
        raise ValidationFailed(
            'payload of a stop or cleanup command is {"member": "<start command id>"}.',
            field="payload.member",
        )
    return payload
