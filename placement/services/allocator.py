"""The allocator: which nodes and which cards a node Fleet's waiting work gets (R1–R3).

Admission said which Fleet (P1–P7); fit there was a check. Here cards are held by device —
index and UUID — on placeable nodes only (L1: a live lease, a fresh inventory, schedulable,
no cordon, not quiet for train; the Fleet active), never more than a node has, and each card
by one member at a time: the Fleet's row is locked for the pass (two allocators, in two
workers or two beats, take turns), and a unique row per held card refuses a second holder
in the database itself.

A pass is three steps. Read what waits (placement.services.waiting: jobs, replicas,
playground sessions, episodes, each as one typed request) and what the placeable nodes have
free, in a fixed number of queries. Decide, a pure function (placement.decide: admission
order, best fit, a gang all or nothing, reservations past a bound — R2, R3). Write what was
decided — attempts, start commands, members, held cards, the owners' moves and their audit
events — with one writer for every kind, in a fixed number of statements whatever the number
of requests and nodes (``make bench``).

On a Fleet with quotas the pass decides by them (Q1–Q3, placement.sharing) and brings each
project's use forward (placement.services.ledger); what it could not place may then preempt
running work (Q4–Q7, placement.services.preempting). Why each request it did not place waits
is written on its record by the same pass (Q8, placement.waits), only when it changed; like
the use, it is the pass's reading, not a change anyone made, and is not audited.

Admission's gates are asked again of everything the pass would place (R22): an item whose
Fleet is no longer open to its project (F8's one selector), no longer promises its
capability, or is not active, is left out of the decision and waits ``fleet_closed``. What
already runs there is left running (D1).
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.services import audit_record_each
from fleets.choices import FleetKind
from fleets.models import Fleet
from fleets.selectors import projects_fleet_open_to
from nodes.checks import HealthCheck
from nodes.checks import placeable as check_ended
from nodes.choices import LEAVING, CommandKind, SchedulingState
from nodes.inventory import has_container_runtime
from nodes.models import CardAlias, Node, NodeCordon
from nodes.selectors import nodes_placeable
from nodes.services.commands import node_commands_create_many

from .. import waits as why
from ..choices import (
    EPISODE_LIFECYCLE,
    JOB_LIFECYCLE,
    Cleanup,
    DeploymentState,
    EpisodeState,
    JobState,
    RevisionState,
)
from ..decide import NodeCapacity, Placement, Request, decide
from ..disclosure import victims_shown, wait_shown
from ..metrics import ALLOCATION_WAIT, ALLOCATOR_PASS, counted
from ..models import (
    Attempt,
    CardHold,
    Deployment,
    Episode,
    Member,
    PlaygroundSession,
    Revision,
)
from ..waits import Wait
from .ledger import pass_book
from .preempting import preempt
from .starts import host
from .waiting import (
    ALLOCATOR,
    JOB_MODELS,
    SESSION_WAITS,
    Waiting,
    WaitingEpisode,
    WaitingJob,
    WaitingSession,
    member_kind,
    member_view,
    run_fields_load,
    waiting,
    waits_record,
)

logger = logging.getLogger("tuneplane.allocator")


def _capacities(fleet: Fleet, now) -> tuple[dict[str, NodeCapacity], dict[str, int]]:
    """Placeable nodes with their free devices and budgets: three queries (four where the
    Fleet has a health check, H5: a card takes work only once its last check ended — read
    after the members, so that a member's cleanup and the check it owes its cards, written
    in one transaction, are never seen half). With the idle cards awaiting a check, by
    node."""
    quiet_flags = ("quiet_train", "quiet_serve", "quiet_env")
    nodes = [
        (
            node_id,
            address,
            inventory,
            unhealthy,
            frozenset(f for f, q in zip(quiet_flags, quiet, strict=True) if q),
        )
        for node_id, address, inventory, unhealthy, *quiet in nodes_placeable(
            [fleet.id], now
        ).values_list("id", "address", "inventory", "unhealthy_cards", *quiet_flags)
    ]
    series_of = dict(
        CardAlias.objects.filter(series__isnull=False).values_list("name", "series__slug")
    )
    in_use: dict[str, list] = {}
    ports: dict[str, set[int]] = {}
    for node_id, cards, cpus, memory, port in Member.objects.filter(
        node_id__in=[node_id for node_id, *_ in nodes], cleanup=Cleanup.PENDING
    ).values_list("node_id", "cards", "cpus", "memory_bytes", "port"):
        in_use.setdefault(node_id, []).append((cards, cpus, memory))
        if port:
            ports.setdefault(node_id, set()).add(port)
    checked = HealthCheck.of(fleet.config) is not None
    card_checks = (
        dict(
            Node.objects.filter(pk__in=[node_id for node_id, *_ in nodes]).values_list(
                "id", "card_checks"
            )
        )
        if checked and nodes
        else {}
    )
    capacities, awaiting = {}, {}
    for node_id, address, inventory, unhealthy, quiet in nodes:
        held = {card["index"] for cards, _, _ in in_use.get(node_id, []) for card in cards}
        free: dict[str, list[dict]] = {"": []}
        totals: dict[str, int] = {"": 0}
        card_series: dict[int, str] = {}
        for device in inventory.get("devices", []):
            if device["uuid"] in unhealthy:  # out of new work until healthy again
                continue
            series = series_of.get(device["name"])
            totals[""] += 1
            if series:
                totals[series] = totals.get(series, 0) + 1
            card_series[device["index"]] = series or ""
            if device["index"] in held:
                continue
            if checked and not check_ended(card_checks[node_id].get(device["uuid"])):
                awaiting[node_id] = awaiting.get(node_id, 0) + 1
                continue
            free[""].append(device)
            if series:
                free.setdefault(series, []).append(device)
        cpus, memory = inventory.get("cpu_budget"), inventory.get("memory_budget_bytes")
        for _, used_cpus, used_memory in in_use.get(node_id, []):
            cpus = cpus - (used_cpus or 0) if cpus is not None else None
            memory = memory - (used_memory or 0) if memory is not None else None
        capacities[node_id] = NodeCapacity(
            node_id,
            address,
            free,
            cpus,
            memory,
            totals,
            ports.get(node_id, set()),
            quiet,
            has_container_runtime(inventory),
            inventory.get("cpu_budget"),
            inventory.get("memory_budget_bytes"),
            card_series,
        )
    return capacities, awaiting


def _unavailable(
    fleet: Fleet, capacities: dict[str, NodeCapacity], awaiting: dict[str, int]
) -> why.Unavailable:
    """Q8, Q9, P8, H5: the Fleet's cards no pass can use now, by why
    (placement.waits.unavailable), with the cordons' words and the idle cards ``awaiting``
    their health check. Two queries."""
    cordons: dict[str, list[str]] = {}
    for node_id, source, reason in (
        NodeCordon.objects.filter(node__fleet=fleet)
        .order_by("created_at", "source")
        .values_list("node_id", "source", "reason")
    ):
        cordons.setdefault(node_id, []).append(f"{source}: {reason}")
    rows = [
        why.NodeRow(
            node_id,
            cards,
            len(unhealthy or {}),
            tuple(cordons.get(node_id, ())),
            state in LEAVING or drained is not None,
            awaiting.get(node_id, 0),
        )
        for node_id, cards, state, unhealthy, drained in Node.objects.filter(fleet=fleet)
        .exclude(scheduling_state=SchedulingState.REMOVED)
        .values_list("id", "card_count", "scheduling_state", "unhealthy_cards", "drain_started_at")
    ]
    return why.unavailable(rows, capacities)


def _closed(fleet: Fleet, items: dict[Request, Waiting]) -> dict[tuple, Wait]:
    """R22: why each request whose Fleet a gate of admission now shuts waits
    (``fleet_closed``): one query for the projects the Fleet is still open to."""
    open_to = projects_fleet_open_to(fleet.pk, {item.project_id for item in items.values()})
    closed = {}
    for request, item in items.items():
        wait = why.fleet_closed(
            open_to_project=item.project_id in open_to,
            capability=item.capability,
            promised=item.capability in fleet.capabilities,
            state=fleet.state,
        )
        if wait is not None:
            closed[request.key] = wait
    return closed


def allocate(*, fleet_id: str) -> dict:
    """One pass over a node Fleet's queue, in one transaction. Returns what it did."""
    now = timezone.now()
    with transaction.atomic():
        fleet = Fleet.objects.select_for_update().filter(pk=fleet_id).first()
        if fleet is None or fleet.kind != FleetKind.NODE:
            return {"allocated": 0, "waiting": 0, "preempted": 0}
        queue = waiting(fleet)
        if not queue:
            return {"allocated": 0, "waiting": 0, "preempted": 0}
        bound = now - timedelta(seconds=settings.TUNEPLANE_ALLOCATION_RESERVE_AFTER)
        items = {}
        for item in queue:
            items[item.request(bound)] = item
        waits: dict = _closed(fleet, items)
        placeable = {r: item for r, item in items.items() if r.key not in waits}
        decided, preempted = [], 0
        if placeable:
            capacities, awaiting = _capacities(fleet, now)
            book = pass_book(fleet, now)
            placements = decide(
                list(placeable),
                capacities,
                now,
                book,
                waits,
                _unavailable(fleet, capacities, awaiting),
            )
            decided = [(items[p.request], p) for p in placements]
            run_fields_load([item for item, _ in decided])
            if decided:
                _write(fleet, decided, capacities, now)
            preempted = preempt(fleet, placeable, waits, capacities, book, now) if book else 0
        waits = why.positioned(waits, list(items))
        waits_record({r.key: item for r, item in items.items()}, waits, now)
    waiting_now = len(queue) - len(decided)
    if counted():
        ALLOCATOR_PASS.observe((timezone.now() - now).total_seconds())
        for item, _ in decided:
            ALLOCATION_WAIT.observe((now - item.owner.created_at).total_seconds())
    if decided or preempted:
        logger.info(
            "fleet %s: %d allocated, %d waiting, %d preempted",
            fleet_id,
            len(decided),
            waiting_now,
            preempted,
        )
    return {"allocated": len(decided), "waiting": waiting_now, "preempted": preempted}


def allocate_preview(record) -> dict | None:
    """Q7: what the Fleet's next pass would do with ``record``, a job or a deployment just
    admitted in the caller's transaction (which the caller rolls back): the pass itself, run
    in a savepoint rolled back at once. Whether it would start and on which nodes, or why it
    would wait and which running jobs it would preempt — another project's job as "another
    project's work" (R23): a dry run answers for the project it is submitted to, to whoever
    asks, administrators too (they read the names on the victims' records once it runs).
    Writes nothing; None off a node Fleet."""
    if record.fleet.kind != FleetKind.NODE:
        return None
    with transaction.atomic():
        allocate(fleet_id=record.fleet_id)
        if isinstance(record, Deployment):
            revision = record.revisions.order_by("-number").first()
            members = Member.objects.filter(revision=revision)
            waits = list(revision.waiting.values())
        else:
            record.refresh_from_db(fields=["waiting"])
            members = Member.objects.filter(**{f"attempt__{Attempt.job_field(record)}": record})
            waits = [record.waiting] if record.waiting else []

        def own(project) -> bool:
            return project == record.project_id

        answer = {
            "starts": members.exists(),
            "nodes": sorted(set(members.values_list("node_id", flat=True))),
            "waiting": wait_shown(waits[0], own) if waits else None,
            "preempts": victims_shown(
                [
                    victim
                    for wait in waits
                    if wait["reason"] == "preempting"
                    for victim in wait["numbers"]["victims"]
                ],
                own,
            ),
        }
        transaction.set_rollback(True)
    return answer


def _write(fleet: Fleet, decided: list[tuple[Waiting, Placement]], capacities, now) -> None:
    """Attempts (a job's), start commands, members, held cards (with their series) and the
    owners' moves for every kind at once: a fixed number of statements for the whole pass,
    each change audited (A1)."""
    addresses = {node_id: node.address for node_id, node in capacities.items()}
    attempts = _attempts(fleet, [item for item, _ in decided], now)
    commands, placed = [], []  # placed: (item, attempt, rank, node, cards) a member each
    for item, placement in decided:
        attempt = attempts.get(item.kind, {}).get(item.owner.pk)
        rendezvous = _rendezvous(item, placement, attempt, addresses)
        for rank, (node_id, cards) in enumerate(placement.members):
            cards, given = list(cards), placement.given[rank]
            payload = item.payload(rank, cards, attempt, rendezvous, given)
            commands.append((node_id, CommandKind.START, payload))
            # A gang's rank 0 holds its rendezvous port in the ledger while it runs (R16).
            port = {"port": placement.rendezvous_port} if rank == 0 and rendezvous else {}
            placed.append((item, placement, attempt, rank, node_id, cards, given, port))
    created = node_commands_create_many(actor=ALLOCATOR, commands=commands)
    members = Member.objects.bulk_create(
        [
            Member(
                **item.member(attempt),
                rank=rank if isinstance(item, WaitingJob) else item.rank,
                node_id=node_id,
                command=command,
                cards=cards,
                cpus=given[0],
                memory_bytes=given[1],
                project_id=item.project_id,
                quota_series=placement.quota_series,
                borrowed=placement.borrowed,
                **port,
            )
            for (item, placement, attempt, rank, node_id, cards, given, port), command in zip(
                placed, created, strict=True
            )
        ]
    )
    CardHold.objects.bulk_create(
        [
            CardHold(
                node_id=member.node_id,
                index=card["index"],
                uuid=card["uuid"],
                member=member,
                series=capacities[member.node_id].card_series.get(card["index"], ""),
            )
            for member in members
            for card in member.cards
        ]
    )
    audit_record_each(
        actor=ALLOCATOR,
        target_type="placement.member",
        events=[
            (f"{member_kind(member)}.created", member.pk, None, member_view(member))
            for member in members
        ],
    )
    _owners_start([item for item, _ in decided], attempts)


def _attempts(fleet: Fleet, items: list[Waiting], now) -> dict[str, dict[int, Attempt]]:
    """A new attempt for each placed job, numbered after its last: by job kind and id."""
    jobs = [item.owner for item in items if isinstance(item, WaitingJob)]
    if not jobs:
        return {}
    numbers: dict[tuple, int] = {}
    for model in JOB_MODELS:
        key = f"{Attempt.job_field(model)}_id"
        ids = [job.pk for job in jobs if isinstance(job, model)]
        if ids:
            for job_id, number in Attempt.objects.filter(**{f"{key}__in": ids}).values_list(
                key, "number"
            ):
                numbers[(model, job_id)] = max(numbers.get((model, job_id), 0), number)
    created = Attempt.objects.bulk_create(
        [
            Attempt(
                fleet=fleet,
                number=numbers.get((type(job), job.pk), 0) + 1,
                created_at=now,
                **{Attempt.job_field(job): job},
            )
            for job in jobs
        ]
    )
    audit_record_each(
        actor=ALLOCATOR,
        target_type="placement.attempt",
        events=[("attempt.created", a.pk, None, _attempt_view(a)) for a in created],
    )
    by_kind: dict[str, dict[int, Attempt]] = {}
    for job, attempt in zip(jobs, created, strict=True):
        by_kind.setdefault(job._meta.model_name, {})[job.pk] = attempt
    return by_kind


def _rendezvous(item: Waiting, placement: Placement, attempt, addresses):
    """R4: a gang's rendezvous env for each rank; rank 0's node is the master."""
    if not isinstance(item, WaitingJob) or len(placement.members) < 2:
        return None
    job = item.owner
    master = host(addresses[placement.members[0][0]])
    port = placement.rendezvous_port  # from the node's port ledger (R16)

    def rendezvous(rank):
        return {
            "MASTER_ADDR": master,
            "MASTER_PORT": port,
            "WORLD_SIZE": job.nodes * max(job.cards, 1),
            "RANK": rank,
            "NODE_RANK": rank,
            "LOCAL_WORLD_SIZE": max(job.cards, 1),
        }

    return rendezvous


def _owners_start(items: list[Waiting], attempts) -> None:
    """Placed jobs and episodes move queued → starting (their lifecycles checked), one
    statement a kind, each audited; a replica or a session has no move of its own here, and
    a placed session's reason to wait is cleared."""
    for model in JOB_MODELS:
        jobs = [i.owner for i in items if isinstance(i, WaitingJob) and isinstance(i.owner, model)]
        for job in jobs:
            JOB_LIFECYCLE.check(job.state, JobState.STARTING, target=job.pk)
            job.state, job.waiting = JobState.STARTING, None  # it no longer waits (Q8)
        model.objects.bulk_update(jobs, ["state", "waiting"])
        audit_record_each(
            actor=ALLOCATOR,
            target_type=model._meta.label_lower,
            events=[
                (
                    f"{model._meta.model_name}.starting",
                    job.pk,
                    {"state": JobState.QUEUED},
                    {
                        "state": JobState.STARTING,
                        "attempt": attempts[model._meta.model_name][job.pk].number,
                    },
                )
                for job in jobs
            ],
        )
    # A placed session no longer waits either (Q8): its reason is cleared as a job's is.
    sessions = [
        item.owner for item in items if isinstance(item, WaitingSession) and item.owner.waiting
    ]
    for session in sessions:
        session.waiting = None
    PlaygroundSession.objects.bulk_update(sessions, ["waiting"])
    episodes = [item.owner for item in items if isinstance(item, WaitingEpisode)]
    for episode in episodes:
        EPISODE_LIFECYCLE.check(episode.state, EpisodeState.STARTING, target=episode.pk)
        episode.state, episode.waiting = EpisodeState.STARTING, None
    Episode.objects.bulk_update(episodes, ["state", "waiting"])
    audit_record_each(
        actor=ALLOCATOR,
        target_type="placement.episode",
        events=[
            ("episode.starting", e.pk, {"state": EpisodeState.QUEUED}, {"state": e.state})
            for e in episodes
        ],
    )


def _attempt_view(attempt: Attempt) -> dict:
    return {
        "job": f"{attempt.job._meta.model_name}-{attempt.job.pk}",
        "number": attempt.number,
        "state": attempt.state,
    }


def allocate_all() -> dict:
    """The beat's safety net: a pass for every node Fleet with queued jobs or replicas of
    live revisions to place — active or not, so that work on a Fleet drained or disabled
    says it waits ``fleet_closed`` (R22)."""
    fleet_ids = set(
        Revision.objects.filter(
            state=RevisionState.LIVE,
            port__isnull=False,
            deployment__state=DeploymentState.LIVE,
            deployment__fleet__kind=FleetKind.NODE,
        ).values_list("deployment__fleet_id", flat=True)
    )
    for model in JOB_MODELS:
        fleet_ids.update(
            model.objects.filter(state=JobState.QUEUED, fleet__kind=FleetKind.NODE).values_list(
                "fleet_id", flat=True
            )
        )
    fleet_ids.update(
        PlaygroundSession.objects.filter(SESSION_WAITS).values_list("fleet_id", flat=True),
        Episode.objects.filter(state=EpisodeState.QUEUED).values_list(
            "environment__fleet_id", flat=True
        ),
    )
    done = {fleet_id: allocate(fleet_id=fleet_id) for fleet_id in sorted(fleet_ids)}
    return {"fleets": len(done), "allocated": sum(d["allocated"] for d in done.values())}
