"""Members whose node went away, and gangs that never came together (R3, R8, R9).

A lost stream changes nothing about running work (L5). A deployment's replicas are never
given up here: a deployment never moves by itself (S3; placement.services.serving). When the
liveness sweep declares a node ``gone``, its live members become ``unknown``; a node back
before the reconcile deadline (TUNEPLANE_RECONCILE_DEADLINE after gone) that still runs them
has them ``running`` again — no retry, no kill — and one that reports them finished or does
not know them has that recorded (nodes.services.commands reconciles its Hello). Past the
deadline the console gives up: the member is ``lost``, its attempt too, and the job gets
another attempt while it has attempts left. Whatever of a given-up attempt still runs when
its node returns is stopped and cleaned up by the cleanup sent when it was given up.

A gang's attempt whose members are not all ``running`` within the gang deadline fails
``gang_deadline``; its started members are stopped and cleaned, and the retry waits a
backoff (60 s, doubling to an hour) — or, when no member had ended on its own, the machine's
(H1, H2: placement.services.runs).
"""

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from nodes.choices import CommandState, SchedulingState
from nodes.models import NodeCommand
from nodes.services.commands import node_command_lost
from tuneplane.lifecycle import move

from ..choices import MEMBER_LIFECYCLE, RunState
from ..models import Attempt, Member
from .members import RUNS
from .runs import attempt_end, attempt_settle, locked_run
from .waiting import member_kind

BACKOFF_FIRST = 60
BACKOFF_MAX = 3600


def backoff(attempt_number: int) -> timedelta:
    return timedelta(seconds=min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** max(0, attempt_number - 1)))


def _gone_since_cutoff(now):
    """A node is gone once silent past its thresholds (L4; the longest, to be safe): it has
    been gone longer than the reconcile deadline when it has been silent longer than both."""
    gone_after = max(
        settings.TUNEPLANE_QUIET_TRAIN,
        settings.TUNEPLANE_QUIET_SERVE,
        settings.TUNEPLANE_QUIET_ENV,
    )
    return now - timedelta(seconds=gone_after + settings.TUNEPLANE_RECONCILE_DEADLINE)


def members_reconcile(*, now=None) -> dict[str, int]:
    """One pass: gone → unknown, back → running, past the deadline → lost; late gangs.
    Each member is settled in a transaction of its own, its command locked before it (the
    order a node's report takes), and no node row is locked: heartbeats never wait on it."""
    now = now or timezone.now()
    done = {"unknown": 0, "running_again": 0, "lost": 0, "gang_deadline": 0}
    moves = (
        (
            "unknown",
            Member.objects.filter(
                attempt__isnull=False,
                state__in=(RunState.STARTING, RunState.RUNNING),
                node__scheduling_state=SchedulingState.GONE,
            ),
            RunState.UNKNOWN,
            "node_gone",
        ),
        (
            "running_again",
            Member.objects.filter(
                attempt__isnull=False, state=RunState.UNKNOWN, command__state=CommandState.RUNNING
            ).exclude(node__scheduling_state=SchedulingState.GONE),
            RunState.RUNNING,
            "",
        ),
    )
    for counted, members, state, reason in moves:
        for member_id, command_id, attempt_id in list(
            members.values_list("id", "command_id", "attempt_id")
        ):
            with transaction.atomic():
                NodeCommand.objects.select_for_update().filter(pk=command_id).first()
                locked = locked_run(attempt_id)
                member = next(m for m in locked[2] if m.pk == member_id)
                if not members.filter(pk=member_id).exists():
                    continue  # moved meanwhile: a report came first
                move(
                    member,
                    MEMBER_LIFECYCLE,
                    state,
                    actor=RUNS,
                    reason=reason,
                    action=f"{member_kind(member)}.{state}",
                )
                attempt_settle(attempt_id, locked=locked)
                done[counted] += 1
    past = Member.objects.filter(
        attempt__isnull=False,
        state=RunState.UNKNOWN,
        node__scheduling_state=SchedulingState.GONE,
        node__last_seen_at__lt=_gone_since_cutoff(now),
    ).values_list("command_id", flat=True)
    for command_id in list(past):
        with transaction.atomic():
            command = NodeCommand.objects.select_for_update().filter(pk=command_id).first()
            if command is not None:
                done["lost"] += node_command_lost(command=command, reason="lost")
    done["gang_deadline"] = _gangs_past_deadline(now)
    return done


def _gangs_past_deadline(now) -> int:
    """Each late gang in a transaction of its own, locked in the one order (locked_run)."""
    failed = 0
    for attempt_id in list(
        Attempt.objects.filter(state=RunState.STARTING).values_list("pk", flat=True)
    ):
        with transaction.atomic():
            job, attempt, members = locked_run(attempt_id)
            deadline = job.gang_deadline_seconds or settings.TUNEPLANE_GANG_DEADLINE
            if (
                attempt.state != RunState.STARTING
                or job.nodes < 2
                or attempt.created_at + timedelta(seconds=deadline) > now
            ):
                continue
            attempt_end(attempt, members, RunState.FAILED, "gang_deadline", now)
            job.not_before = now + backoff(attempt.number)
            job.save(update_fields=["not_before"])
            attempt_settle(attempt_id, locked=(job, attempt, members))
            failed += 1
    return failed
