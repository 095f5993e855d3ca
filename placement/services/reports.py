"""One way a node's report reaches placement's records.

nodes carries the agents' reports and never imports placement: ``command_observed`` is the
one observer placement registers with it (placement.apps), called inside the transaction
that stored a command's change. For a member's start command it reads, in one query, which
record owns the member, and hands the report to that owner: the owner locks itself and its
members in its own order, the member follows (members.member_follow) and the owner settles
through its own lifecycle. A cleanup that confirms a member its node no longer knew is
recorded on the member's start command, which comes back here as a change of its own.
"""

from nodes.choices import CommandKind, CommandState
from nodes.models import NodeCommand
from nodes.services.commands import node_command_cleaned_by_id

from ..models import Member
from .episodes import episode_member_reported
from .playground import session_member_reported
from .runs import attempt_member_reported
from .serving import deployment_member_reported

# The owner's id column, read with the member, and who settles a report for that owner.
OWNERS = (
    ("attempt_id", attempt_member_reported),
    ("revision__deployment_id", deployment_member_reported),
    ("session_id", session_member_reported),
    ("episode_id", episode_member_reported),
)


def command_observed(command: NodeCommand, before: dict) -> None:
    """A node's report moved one of its commands: the member it stands for, if any, follows."""
    if (
        command.kind == CommandKind.CLEANUP
        and command.state == CommandState.SUCCEEDED
        and command.reason == "unknown_member"
    ):
        # The node did not know the member (its state was lost) and cleaned up by its id:
        # nothing of it is left there. A member it knows says so itself (R7).
        start = (
            NodeCommand.objects.select_for_update()
            .filter(pk=command.payload.get("member"), node_id=command.node_id)
            .first()
        )
        if start is not None:
            node_command_cleaned_by_id(command=start)
        return
    if command.kind != CommandKind.START:
        return
    owners = (
        Member.objects.filter(command_id=command.pk)
        .values_list(*(column for column, _ in OWNERS))
        .first()
    )
    for owner_id, (_, reported) in zip(owners or (), OWNERS, strict=False):
        if owner_id is not None:
            reported(owner_id, command, before)
            return
