"""Preemption on a node Fleet with quotas (Q4–Q7): what an allocator pass does for the
requests it could not place, once it has decided.

The pass hands over what still waits, why, and what its decision left free and booked.
Preemption then works in three steps, in a fixed number of statements however many jobs
run, wait or are preempted:

1. Read what runs. Each running job of the Fleet becomes a ``Running``: its project, quota,
   whether it borrows, priority, start, and its members' nodes, cards and budgets.
2. Decide. ``placement.preemption.plan`` is pure: which waiting requests preemption makes
   fit, and their victims.
3. Write. Each victim's job moves ``running → preempting`` and records who preempted it,
   why and its deadline. Its members get the agent's stop: SIGTERM, then SIGKILL after
   ``TUNEPLANE_PREEMPT_GRACE``, or the less the job asks for. The preemptor records its
   victims; each of those is one audit event (Q7).

A request whose victims are still stopping waits with the reason ``preempting``, their
deadlines as its numbers. It picks no more victims, and its cards count against its quota
(so its project's next request does not reclaim the same guarantee twice). Once a victim's
members have ended, runs ends its attempt ``preempted`` and queues the job again in its old
place (placement.services.runs). Its cards go back when the node confirms the cleanup (R7),
and that pass places the preemptor.

A Fleet without quotas preempts nothing: first come, best effort, as before (Q1).

A dry run (Q7) runs the whole pass, this included, in a savepoint it rolls back
(placement.services.allocator.allocate_preview): whom a request would preempt now.
"""

from datetime import datetime, timedelta

from django.conf import settings

from audit.services import audit_record_each
from fleets.models import Fleet
from nodes.choices import CommandKind

from ..choices import JOB_LIFECYCLE, RUN_LIVE, Cleanup, JobState, RunState
from ..decide import NodeCapacity, Request
from ..disclosure import guarantee_why, preempting_message
from ..models import Attempt, Member
from ..preemption import Running, plan
from ..sharing import Book
from ..waits import Wait
from .members import members_send
from .waiting import ALLOCATOR, JOB_MODELS, Waiting

# A request's own reasons to wait that preemption does not answer: a retry's backoff, and
# its project's limit (preempting frees cards, it never raises a limit).
NOT_ANSWERED = ("backoff", "quota")


def named(key: tuple) -> str:
    """A request's key as its records and audit events name it: trainingjob-7, replica-3-0."""
    kind, pk, rank = key
    return f"replica-{pk}-{rank}" if kind == "replica" else f"{kind}-{pk}"


def preempt(
    fleet: Fleet,
    items: dict[Request, Waiting],
    waits: dict[tuple, Wait],
    capacities: dict[str, NodeCapacity],
    book: Book,
    now: datetime,
) -> int:
    """Q5, Q6 after a pass's decision on ``fleet``: its victims stopped, each waiting
    preemptor's reason to wait made ``preempting``. ``capacities`` and ``book`` are the
    pass's, used up. Returns how many jobs it preempted."""
    stopping = _stopping(fleet)
    eligible = []
    for request in items:
        wait = waits.get(request.key)
        if wait is None:
            continue
        victims = stopping.get(named(request.key))
        if victims:
            book.take(book.key(request.project, request.series), request.total_cards)
            waits[request.key] = _preempting(wait, victims)
        elif wait.reason not in NOT_ANSWERED:
            eligible.append(request)
    if not eligible:
        return 0
    running = running_jobs(fleet, capacities)
    if not running:
        return 0
    minimum = settings.TUNEPLANE_PREEMPT_MIN_RUNTIME
    stopped = _stop(plan(eligible, running, capacities, book, now, minimum), items, now)
    for key, shown in stopped.items():
        waits[key] = _preempting(waits[key], shown)
    _preemptors_record(stopped, items)
    return sum(len(shown) for shown in stopped.values())


def _why(victim: Running, waiter: Request, item: Waiting) -> str:
    """Why, as administrators read it; a member of the victim's project reads another
    project's preemptor as another project's work (placement.disclosure, R23)."""
    project = item.owner.project.slug if hasattr(item.owner, "project") else waiter.project
    if victim.project != waiter.project:
        return guarantee_why(f"project {project}")
    return (
        f"a job of its project with priority {waiter.priority} waits; this one has "
        f"priority {victim.priority} (rule Q5)"
    )


def _stop(planned, items: dict[Request, Waiting], now: datetime) -> dict[tuple, list[dict]]:
    """Q6 for every victim of the pass at once, in a fixed number of statements: its job
    ``running → preempting`` (its lifecycle checked), with who preempted it, why and its
    deadline, one audit event each; its live members stopped with the preemption grace. Rows
    are locked in the one order runs' writers take (jobs, then attempts, then members); a
    victim that ended meanwhile is left out. Returns each preemptor's victims as shown."""
    victims = {victim.attempt: (waiter, victim) for waiter, chosen in planned for victim in chosen}
    if not victims:
        return {}
    jobs = {}
    for model in JOB_MODELS:
        kind = model._meta.model_name
        ids = [victim.key[1] for _, victim in victims.values() if victim.key[0] == kind]
        for job in model.objects.select_for_update().filter(pk__in=ids).order_by("pk"):
            jobs[(kind, job.pk)] = job
    attempts = {
        attempt.pk: attempt
        for attempt in Attempt.objects.select_for_update().filter(pk__in=victims).order_by("pk")
    }
    members: dict[int, list[Member]] = {}
    for member in Member.objects.select_for_update().filter(attempt_id__in=victims).order_by("pk"):
        members.setdefault(member.attempt_id, []).append(member)
    stopped: dict[tuple, list[dict]] = {}
    moved: dict[type, list] = {}
    by_grace: dict[int, list[Member]] = {}
    for attempt_id, (waiter, victim) in victims.items():
        job, attempt = jobs.get(victim.key), attempts.get(attempt_id)
        if job is None or attempt is None or attempt.state != RunState.RUNNING:
            continue
        if job.state != JobState.RUNNING:
            continue
        JOB_LIFECYCLE.check(job.state, JobState.PREEMPTING, target=job.pk)
        grace = settings.TUNEPLANE_PREEMPT_GRACE
        if job.preemption_grace_seconds is not None:
            grace = min(grace, job.preemption_grace_seconds)
        job.preemption = {
            "by": named(waiter.key),
            "by_project": waiter.project,  # whose: what a reader may be shown of it (R23)
            "why": _why(victim, waiter, items[waiter]),
            "at": now.isoformat(),
            "deadline": (now + timedelta(seconds=grace)).isoformat(),
        }
        job.state, job.reason = JobState.PREEMPTING, "preempted"
        moved.setdefault(type(job), []).append((job, attempt.number))
        live = [m for m in members.get(attempt_id, []) if m.state in RUN_LIVE]
        by_grace.setdefault(grace, []).extend(live)
        shown = {
            "job": f"{job._meta.model_name}-{job.pk}",
            "deadline": job.preemption["deadline"],
            "project": job.project_id,
        }
        stopped.setdefault(waiter.key, []).append(shown)
    for model, done in moved.items():
        model.objects.bulk_update([job for job, _ in done], ["state", "reason", "preemption"])
        audit_record_each(
            actor=ALLOCATOR,
            target_type=model._meta.label_lower,
            events=[
                (
                    f"{model._meta.model_name}.preempting",
                    job.pk,
                    {"state": JobState.RUNNING},
                    {
                        "state": job.state,
                        "reason": job.reason,
                        "preemption": job.preemption,
                        "attempt": number,
                    },
                )
                for job, number in done
            ],
        )
    for grace, live in by_grace.items():
        members_send(CommandKind.STOP, live, now, grace_seconds=grace)
    return stopped


def _preemptors_record(stopped: dict[tuple, list[dict]], items: dict[Request, Waiting]) -> None:
    """Q7: one audit event on each preemptor naming its victims: a statement a kind."""
    owners = {request.key: item.owner for request, item in items.items()}
    by_type: dict[str, list] = {}
    for key, victims in stopped.items():
        owner = owners[key]
        by_type.setdefault(owner._meta.label_lower, []).append(
            (
                f"{owner._meta.model_name}.preempts",
                owner.pk,
                {"victims": []},
                {"preemptor": named(key), "victims": victims},
            )
        )
    for target_type, events in by_type.items():
        audit_record_each(actor=ALLOCATOR, target_type=target_type, events=events)


def _preempting(wait: Wait, victims: list[dict]) -> Wait:
    """Q8: a preemptor waits for its victims to stop, their deadlines its numbers."""
    last = max(victim["deadline"] for victim in victims)
    return Wait(
        "preempting",
        preempting_message([victim["job"] for victim in victims], last),
        {"victims": victims},
        wait.position_in_project,
        wait.position_in_fleet,
    )


def _stopping(fleet: Fleet) -> dict[str, list[dict]]:
    """The Fleet's jobs being preempted, by their preemptor: a query a job kind."""
    stopping: dict[str, list[dict]] = {}
    for model in JOB_MODELS:
        for pk, project, preemption in model.objects.filter(
            fleet=fleet, state=JobState.PREEMPTING
        ).values_list("pk", "project_id", "preemption"):
            if preemption:
                stopping.setdefault(preemption["by"], []).append(
                    {
                        "job": f"{model._meta.model_name}-{pk}",
                        "deadline": preemption["deadline"],
                        "project": project,
                    }
                )
    return stopping


def running_jobs(fleet: Fleet, capacities: dict[str, NodeCapacity]) -> list[Running]:
    """Q4, Q5: the Fleet's running jobs as preemption weighs them. Each member's cards carry
    their series; a card that is unhealthy is not listed, as freeing it frees nothing. A
    query a job kind and one for their members."""
    jobs: dict[tuple[str, int], tuple] = {}
    for model in JOB_MODELS:
        for pk, project, priority, preemptible in model.objects.filter(
            fleet=fleet, state=JobState.RUNNING
        ).values_list("pk", "project_id", "priority", "preemptible"):
            jobs[(model._meta.model_name, pk)] = (project, priority, preemptible)
    if not jobs:
        return []
    members: dict[tuple[str, int], list] = {}
    for row in (
        Member.objects.filter(
            attempt__fleet=fleet, attempt__state=RunState.RUNNING, cleanup=Cleanup.PENDING
        )
        .order_by("attempt_id", "rank")
        .values_list(
            "attempt__training_job_id",
            "attempt__lifecycle_job_id",
            "attempt_id",
            "attempt__started_at",
            "checkpointed_at",
            "node_id",
            "cards",
            "cpus",
            "memory_bytes",
            "quota_series",
            "borrowed",
        )
    ):
        training, lifecycle, *rest = row
        key = ("trainingjob", training) if training else ("lifecyclejob", lifecycle)
        if key in jobs:
            members.setdefault(key, []).append(rest)
    running = []
    for key, rows in members.items():
        project, priority, preemptible = jobs[key]
        attempt, started_at, *_, quota_series, borrowed = rows[0]
        running.append(
            Running(
                key=key,
                project=project,
                quota=(project, quota_series),
                borrowed=borrowed,
                preemptible=preemptible,
                priority=priority,
                started_at=started_at,
                # H4: a gang's checkpoint is any member's (rank 0 writes it, as a rule).
                checkpointed_at=max((row[2] for row in rows if row[2]), default=None),
                members=tuple(
                    (node_id, _with_series(capacities.get(node_id), cards))
                    for _, _, _, node_id, cards, *_ in rows
                ),
                given=tuple((cpus, memory) for *_, cpus, memory, _, _ in rows),
                attempt=attempt,
            )
        )
    return running


def _with_series(node: NodeCapacity | None, cards: list[dict]) -> tuple[dict, ...]:
    if node is None:  # not placeable now: what it holds there frees nothing for this pass
        return ()
    return tuple(
        {**card, "series": node.card_series[card["index"]]}
        for card in cards
        if card["index"] in node.card_series
    )
