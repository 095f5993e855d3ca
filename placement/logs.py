"""Which member a logs request means, and its output read from its node (nodes.services.logs):
the tail, or what was written from an offset on. Reads: nothing here is audited.

The record itself is found by the caller through the visibility selectors (F8): a record the
caller may not see never reaches these functions."""

from nodes.services.logs import LogRead, log_read
from tuneplane.errors import NotFound

from .models import Attempt, Deployment, Episode, Member


def job_member(*, job, attempt: int | None = None, rank: int = 0) -> Member:
    """The member of rank ``rank`` of the job's latest attempt, or of the one named."""
    members = Member.objects.select_related("attempt", "node").filter(
        **{f"attempt__{Attempt.job_field(job)}": job}, rank=rank
    )
    if attempt is not None:
        members = members.filter(attempt__number=attempt)
    member = members.order_by("-attempt__number").first()
    if member is None:
        raise NotFound(
            "No such member: the job has no attempt yet, or not that attempt or rank.",
            field="attempt" if attempt is not None else "rank",
        )
    return member


def replica_member(*, deployment: Deployment, revision: int | None = None, replica: int = 0):
    """Replica ``replica`` of the deployment's newest revision, or of the one named."""
    members = Member.objects.select_related("node", "revision").filter(
        revision__deployment=deployment, rank=replica
    )
    if revision is not None:
        members = members.filter(revision__number=revision)
    member = members.order_by("-revision__number").first()
    if member is None:
        raise NotFound(
            "No such replica: not placed yet, or not that revision or replica.",
            field="revision" if revision is not None else "replica",
        )
    return member


def episode_member(*, episode: Episode) -> Member:
    member = episode.members.select_related("node").order_by("-pk").first()
    if member is None:
        raise NotFound("The episode has not been placed on a node yet.", field="episode")
    return member


def member_output(*, member: Member, tail_bytes: int, offset: int | None = None) -> LogRead:
    """Up to ``tail_bytes`` of the member's output from ``offset`` on, or its tail."""
    return log_read(
        node=member.node, member=member.command_id, tail_bytes=tail_bytes, offset=offset
    )


def _split_character(data: bytes) -> int:
    """How many bytes at the end of ``data`` begin a UTF-8 character it does not finish."""
    for back in range(1, min(len(data), 4) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: its lead is further back
            continue
        length = (
            2
            if byte >> 5 == 0b110
            else 3
            if byte >> 4 == 0b1110
            else 4
            if byte >> 3 == 0b11110
            else 1
        )
        return back if length > back else 0
    return 0


def shown(read: LogRead, tail_bytes: int) -> dict:
    """The part of a logs answer every endpoint shares. A character the read cut in two is
    left to the next read (``next_offset`` before it), so a follower never sees it broken."""
    data, next_offset = read.data, read.next_offset
    split = _split_character(data)
    if next_offset is not None and 0 < split < len(data):
        data, next_offset = data[:-split], next_offset - split
    return {
        "tail_bytes": tail_bytes,
        "offset": read.offset,
        "next_offset": next_offset,
        "truncated": read.truncated,
        "output": data.decode("utf-8", errors="replace"),
    }
