"""The allocator: which nodes and which cards a node Fleet's queued jobs get (R1–R3).

Admission said which Fleet (P1–P7); fit there was a check. Here cards are held by device —
index and UUID — on placeable nodes only (L1: a live lease, a fresh inventory, schedulable,
no cordon, not quiet for train; the Fleet active), never more than a node has, and each card
by one member at a time: the Fleet's row is locked for the pass (two allocators, in two
workers or two beats, take turns), and a unique row per held card refuses a second holder
in the database itself. A pass reads the queue, the nodes and what they hold in a fixed
number of queries and writes everything it decided in a fixed number more, whatever the
number of jobs and nodes (``make bench``).

Jobs are taken in admission order (R2). One that cannot start now does not stop later ones
that can; one that has waited longer than TUNEPLANE_ALLOCATION_RESERVE_AFTER reserves the
nodes closest to fitting it, so that smaller jobs behind it cannot starve it. A gang is
allocated all or nothing (R3).
"""

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.services import audit_record_each
from fleets.choices import FleetKind, FleetState
from fleets.models import Fleet
from nodes.choices import CommandKind
from nodes.inventory import has_container_runtime
from nodes.models import CardAlias
from nodes.selectors import nodes_placeable
from nodes.services.commands import node_commands_create_many

from ..choices import Cleanup, DeploymentState, EpisodeState, JobState, RevisionState
from ..metrics import ALLOCATION_WAIT, ALLOCATOR_PASS
from ..models import (
    Attempt,
    CardHold,
    Episode,
    LifecycleJob,
    Member,
    PlaygroundSession,
    Revision,
    TrainingJob,
)
from .payloads import MASTER_PORT_BASE, host, job_payload
from .wants import ALLOCATOR, Want, member_view, wanted, write_wants

logger = logging.getLogger("tuneplane.allocator")

ALLOCATE_TASK = "placement.allocate"
JOB_MODELS = (TrainingJob, LifecycleJob)


@dataclass
class Capacity:
    """What a placeable node has free now, as this pass sees it."""

    node_id: str
    address: str
    free: dict[str, list[dict]]  # series slug (or "" for any card) → free devices
    cpus: float | None
    memory: int | None
    devices_by_series: dict[str, int] = field(default_factory=dict)
    ports: set[int] = field(default_factory=set)  # served members' ports in use here (S1)
    quiet: frozenset = frozenset()  # its capabilities quiet now ("quiet_train", …)
    runtime: bool = False  # a container runtime: where a member naming an image may run

    def free_of(self, series: str) -> list[dict]:
        return self.free.get(series, [])

    def fits(self, job) -> bool:
        return (
            len(self.free_of(job.series)) >= job.cards
            and (not job.cpus or self.cpus is None or self.cpus >= job.cpus)
            and (not job.memory_bytes or self.memory is None or self.memory >= job.memory_bytes)
            and getattr(job, "port", None) not in self.ports
            # A job needs a node not quiet for train; a replica for serve; an episode for env.
            and getattr(job, "quiet", "quiet_train") not in self.quiet
            and (self.runtime or not job.image)
        )

    def could_fit(self, job) -> bool:
        """Once everything on it is cleaned up: whether reserving it for the job helps."""
        return self.devices_by_series.get(job.series, 0) >= job.cards

    def take(self, job) -> list[dict]:
        taken = self.free_of(job.series)[: job.cards]
        for device in taken:
            for devices in self.free.values():
                if device in devices:
                    devices.remove(device)
        if job.cpus and self.cpus is not None:
            self.cpus -= job.cpus
        if job.memory_bytes and self.memory is not None:
            self.memory -= job.memory_bytes
        if getattr(job, "port", None):
            self.ports.add(job.port)
        return [{"index": device["index"], "uuid": device["uuid"]} for device in taken]


def _capacities(fleet: Fleet, now) -> dict[str, Capacity]:
    """Placeable nodes with their free devices and budgets: three queries."""
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
    capacities = {}
    for node_id, address, inventory, unhealthy, quiet in nodes:
        held = {card["index"] for cards, _, _ in in_use.get(node_id, []) for card in cards}
        free: dict[str, list[dict]] = {"": []}
        totals: dict[str, int] = {"": 0}
        for device in inventory.get("devices", []):
            if device["uuid"] in unhealthy:  # out of new work until healthy again
                continue
            series = series_of.get(device["name"])
            totals[""] += 1
            if series:
                totals[series] = totals.get(series, 0) + 1
            if device["index"] in held:
                continue
            free[""].append(device)
            if series:
                free.setdefault(series, []).append(device)
        cpus, memory = inventory.get("cpu_budget"), inventory.get("memory_budget_bytes")
        for _, used_cpus, used_memory in in_use.get(node_id, []):
            cpus = cpus - (used_cpus or 0) if cpus is not None else None
            memory = memory - (used_memory or 0) if memory is not None else None
        capacities[node_id] = Capacity(
            node_id,
            address,
            free,
            cpus,
            memory,
            totals,
            ports.get(node_id, set()),
            quiet,
            has_container_runtime(inventory),
        )
    return capacities


def _queue(fleet: Fleet) -> list:
    """The Fleet's queued jobs of both kinds, in admission order (R2): one query a kind,
    their rows locked for the pass."""
    jobs = [
        job
        for model in JOB_MODELS
        for job in model.objects.filter(
            fleet=fleet, state=JobState.QUEUED, cancel_requested_at__isnull=True
        )
        # Locked: a cancel racing this pass either comes first (and the job is not here)
        # or waits for it (and then stops what it started).
        .select_for_update(of=("self",))
        .select_related("fleet", "project")
        .prefetch_related("volumes", "datasets")
        .order_by("created_at", "id")
    ]
    for job in jobs:
        job.sort_key = (job._meta.model_name, job.pk)
    return jobs


def _pick(job, capacities: dict[str, Capacity], reserved: set[str]) -> list[Capacity] | None:
    """Best fit: the nodes with the fewest free cards that still fit, so that large holes
    stay for large jobs. All of a gang's nodes, or none."""
    fitting = [
        capacity
        for node_id, capacity in capacities.items()
        if node_id not in reserved and capacity.fits(job)
    ]
    if len(fitting) < job.nodes:
        return None
    fitting.sort(key=lambda c: (len(c.free_of(job.series)), c.node_id))
    return fitting[: job.nodes]


def _reserve(job, capacities: dict[str, Capacity], reserved: set[str]) -> None:
    """R2: a job waiting past the bound keeps later jobs off the nodes closest to fitting it."""
    closest = sorted(
        (c for c in capacities.values() if c.node_id not in reserved and c.could_fit(job)),
        key=lambda c: (-len(c.free_of(job.series)), c.node_id),
    )
    reserved.update(capacity.node_id for capacity in closest[: job.nodes])


def _next_numbers(jobs) -> dict:
    numbers = {}
    for model in JOB_MODELS:
        key = f"{Attempt.job_field(model)}_id"
        ids = [job.pk for job in jobs if isinstance(job, model)]
        if ids:
            for job_id, number in Attempt.objects.filter(**{f"{key}__in": ids}).values_list(
                key, "number"
            ):
                numbers[(model, job_id)] = max(numbers.get((model, job_id), 0), number)
    return numbers


def allocate(*, fleet_id: str) -> dict:
    """One pass over a node Fleet's queue, in one transaction. Returns what it did."""
    now = timezone.now()
    with transaction.atomic():
        fleet = Fleet.objects.select_for_update().filter(pk=fleet_id).first()
        if fleet is None or fleet.kind != FleetKind.NODE or fleet.state != FleetState.ACTIVE:
            return {"allocated": 0, "waiting": 0}
        queue = sorted(_queue(fleet) + wanted(fleet), key=lambda w: (w.created_at, w.sort_key))
        if not queue:
            return {"allocated": 0, "waiting": 0}
        capacities = _capacities(fleet, now)
        bound = now - timedelta(seconds=settings.TUNEPLANE_ALLOCATION_RESERVE_AFTER)
        reserved: set[str] = set()
        decided = []
        for job in queue:
            if job.not_before is not None and job.not_before > now:
                continue  # a retry's backoff (R3)
            chosen = _pick(job, capacities, reserved)
            if chosen is None:
                if job.created_at <= bound:
                    _reserve(job, capacities, reserved)
                continue
            decided.append((job, [(c, c.take(job)) for c in chosen]))
        wants = [(want, placed) for want, placed in decided if isinstance(want, Want)]
        jobs = [(job, placed) for job, placed in decided if not isinstance(job, Want)]
        if jobs:
            _write(fleet, jobs, now)
        if wants:
            write_wants(wants)
    waiting = len(queue) - len(decided)
    ALLOCATOR_PASS.observe((timezone.now() - now).total_seconds())
    for job, _ in decided:
        ALLOCATION_WAIT.observe((now - job.created_at).total_seconds())
    if decided:
        logger.info("fleet %s: %d job(s) allocated, %d waiting", fleet_id, len(decided), waiting)
    return {"allocated": len(decided), "waiting": waiting}


def _write(fleet: Fleet, decided, now) -> None:
    """Attempts, start commands, members, held cards and the jobs' new state: a fixed number
    of statements for the whole pass, each change audited (A1)."""
    numbers = _next_numbers([job for job, _ in decided])
    attempts = Attempt.objects.bulk_create(
        [
            Attempt(
                fleet=fleet,
                number=numbers.get((type(job), job.pk), 0) + 1,
                created_at=now,
                **{Attempt.job_field(job): job},
            )
            for job, _ in decided
        ]
    )
    commands = []
    for (job, placed), attempt in zip(decided, attempts, strict=True):
        rendezvous = None
        if job.nodes > 1:
            master = host(placed[0][0].address)
            port = MASTER_PORT_BASE + attempt.pk % 10000

            def rendezvous(rank, master=master, port=port, job=job):
                return {
                    "MASTER_ADDR": master,
                    "MASTER_PORT": port,
                    "WORLD_SIZE": job.nodes * max(job.cards, 1),
                    "RANK": rank,
                    "NODE_RANK": rank,
                    "LOCAL_WORLD_SIZE": max(job.cards, 1),
                }

        for rank, (capacity, cards) in enumerate(placed):
            payload = job_payload(job, attempt.number, rank, cards, rendezvous)
            commands.append((capacity.node_id, CommandKind.START, payload))
    created = iter(node_commands_create_many(actor=ALLOCATOR, commands=commands))
    members = []
    for (job, placed), attempt in zip(decided, attempts, strict=True):
        for rank, (capacity, cards) in enumerate(placed):
            members.append(
                Member(
                    attempt=attempt,
                    rank=rank,
                    node_id=capacity.node_id,
                    command=next(created),
                    cards=cards,
                    cpus=job.cpus,
                    memory_bytes=job.memory_bytes,
                )
            )
    members = Member.objects.bulk_create(members)
    CardHold.objects.bulk_create(
        [
            CardHold(node_id=member.node_id, index=card["index"], uuid=card["uuid"], member=member)
            for member in members
            for card in member.cards
        ]
    )
    for model in JOB_MODELS:
        jobs = [job for job, _ in decided if isinstance(job, model)]
        for job in jobs:
            job.state = JobState.STARTING
        model.objects.bulk_update(jobs, ["state"])
    audit_record_each(
        actor=ALLOCATOR,
        target_type="placement.attempt",
        events=[("attempt.created", a.pk, None, _attempt_view(a)) for a in attempts],
    )
    audit_record_each(
        actor=ALLOCATOR,
        target_type="placement.member",
        events=[("member.created", m.pk, None, member_view(m)) for m in members],
    )
    for model in JOB_MODELS:
        audit_record_each(
            actor=ALLOCATOR,
            target_type=model._meta.label_lower,
            events=[
                (
                    f"{model._meta.model_name}.starting",
                    job.pk,
                    {"state": JobState.QUEUED},
                    {"state": JobState.STARTING, "attempt": attempt.number},
                )
                for (job, _), attempt in zip(decided, attempts, strict=True)
                if isinstance(job, model)
            ],
        )


def _attempt_view(attempt: Attempt) -> dict:
    return {
        "job": f"{attempt.job._meta.model_name}-{attempt.job.pk}",
        "number": attempt.number,
        "state": attempt.state,
    }


def allocate_on_commit(fleet_id: str) -> None:
    """Something changed for a node Fleet (a job admitted, cards released): a pass soon, in
    a worker. The beat's pass over every Fleet is the safety net."""
    transaction.on_commit(lambda: current_app.tasks[ALLOCATE_TASK].delay(fleet_id))


def allocate_all() -> dict:
    """The beat's safety net: a pass for every node Fleet with queued jobs or replicas of
    live revisions to place."""
    fleet_ids = set(
        Revision.objects.filter(
            state=RevisionState.LIVE,
            port__isnull=False,
            deployment__state=DeploymentState.LIVE,
            deployment__fleet__kind=FleetKind.NODE,
            deployment__fleet__state=FleetState.ACTIVE,
        ).values_list("deployment__fleet_id", flat=True)
    )
    for model in JOB_MODELS:
        fleet_ids.update(
            model.objects.filter(
                state=JobState.QUEUED, fleet__kind=FleetKind.NODE, fleet__state=FleetState.ACTIVE
            ).values_list("fleet_id", flat=True)
        )
    fleet_ids.update(
        PlaygroundSession.objects.filter(
            state=DeploymentState.LIVE, port__isnull=False, members__isnull=True
        ).values_list("fleet_id", flat=True),
        Episode.objects.filter(state=EpisodeState.QUEUED).values_list(
            "environment__fleet_id", flat=True
        ),
    )
    done = {fleet_id: allocate(fleet_id=fleet_id) for fleet_id in sorted(fleet_ids)}
    return {"fleets": len(done), "allocated": sum(d["allocated"] for d in done.values())}
