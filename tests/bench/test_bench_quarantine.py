"""`make bench`: H6 at scale — an allocator pass over 1,000 nodes of which 100 carry a
quarantined card, against the same pass over 1,000 nodes without: the issue's bar is within
10 %. Not a timed test: it prints what it measures (each pass is 1,000 queued one-card jobs,
on its own Fleet, so the two start alike)."""

import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from nodes.choices import SchedulingState
from nodes.models import ControlSession, Node
from nodes.selectors import cards_summary
from placement.models import CardHold, TrainingJob
from placement.services.allocator import allocate
from tests.conftest import H100_DEVICE_INVENTORY

pytestmark = [pytest.mark.bench]

NODES, QUARANTINED, JOBS = 1000, 100, 1000


def _fleet_of_nodes(fleet, prefix: str, quarantined: int, awaiting: int = 0) -> None:
    """``quarantined`` nodes with card 3 quarantined; with ``awaiting``, every card's health
    check passed (H5) but card 3's on that many nodes, owed one."""
    now = timezone.now()
    lease = now + timedelta(hours=1)
    nodes = []
    for i in range(NODES):
        devices = [
            {**d, "uuid": f"GPU-{prefix}-{i:05d}-{d['index']}"}
            for d in H100_DEVICE_INVENTORY["devices"]
        ]
        inventory = {**H100_DEVICE_INVENTORY, "devices": devices}
        sick = (
            {devices[3]["uuid"]: {"index": 3, "name": devices[3]["name"], "reason": "XID 79",
                                  "since": now.isoformat()}}
            if i < quarantined
            else {}
        )  # fmt: skip
        passed = {"state": "passed", "at": now.isoformat(), "passes": 1}
        card_checks = (
            {
                d["uuid"]: {**passed, "index": d["index"]}
                if not (i < awaiting and d["index"] == 3)
                else {"state": "due", "index": 3, "at": now.isoformat()}
                for d in devices
            }
            if awaiting
            else {}
        )
        nodes.append(
            Node(
                id=f"n-{prefix}-{i:05d}",
                card_checks=card_checks,
                fleet=fleet,
                hostname=f"{prefix}{i}",
                address=f"10.{i // 250}.{i % 250}.{ord(prefix)}:9100",
                scheduling_state=SchedulingState.SCHEDULABLE,
                inventory=inventory,
                unhealthy_cards=sick,
                **cards_summary(inventory, unhealthy=sick),
                inventory_observed_at=now,
                last_seen_at=now,
                lease_expires_at=lease,
            )
        )
    Node.objects.bulk_create(nodes)
    ControlSession.objects.bulk_create(
        [
            ControlSession(
                id=uuid.uuid4(),
                node=node,
                gateway="bench",
                opened_at=now,
                last_heartbeat_at=now,
                lease_expires_at=lease,
            )
            for node in nodes
        ]
    )


def _pass(fleet, member, project, jobs: int = JOBS) -> float:
    TrainingJob.objects.bulk_create(
        [
            TrainingJob(
                fleet=fleet,
                name=f"job-{n}",
                command=["python", "train.py"],
                admission={"fleet": fleet.id},
                created_by=member,
                project=project,
                cards=1,
            )
            for n in range(jobs)
        ]
    )
    Node.objects.filter(fleet=fleet).update(inventory_observed_at=timezone.now())
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    started = time.perf_counter()
    done = allocate(fleet_id=fleet.id)
    seconds = time.perf_counter() - started
    assert done["allocated"] == jobs
    return seconds


def test_bench_H6_a_pass_with_100_of_1000_nodes_carrying_a_quarantined_card(
    make_fleet, member, project, capsys
):
    """Passes in the order clean, sick, sick, clean, so that neither kind gains from going
    first (the database grows with each pass's records); the sums compared."""
    fleets = {}
    for name, prefix, quarantined in (
        ("clean-a", "a", 0),
        ("sick-b", "b", QUARANTINED),
        ("sick-c", "c", QUARANTINED),
        ("clean-d", "d", 0),
    ):
        fleets[name] = make_fleet(name, kind="node", capabilities=["train"])
        _fleet_of_nodes(fleets[name], prefix, quarantined)
    took = {name: _pass(fleet, member, project) for name, fleet in fleets.items()}
    without = took["clean-a"] + took["clean-d"]
    with_them = took["sick-b"] + took["sick-c"]
    held = set(CardHold.objects.filter(node__fleet=fleets["sick-b"]).values_list("uuid", flat=True))
    assert not held & {f"GPU-b-{i:05d}-3" for i in range(QUARANTINED)}
    with capsys.disabled():
        print(
            f"\nH6: one pass of {JOBS} one-card jobs onto {NODES} nodes x 8 cards, two each: "
            f"{without / 2:.2f} s without quarantined cards, {with_them / 2:.2f} s with "
            f"{QUARANTINED} nodes carrying one ({(with_them / without - 1) * 100:+.1f} %); "
            + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in took.items())
        )


def test_bench_H5_a_pass_on_a_fleet_with_a_health_check(make_fleet, member, project, capsys):
    """H5 at scale: the same pass on a Fleet whose 1,000 nodes' cards were checked (100 with
    a card owed a check) against one without a health check, clean, checked, checked, clean."""
    check = {"health_check": {"command": "true"}}
    fleets = {}
    for name, prefix, config, awaiting in (
        ("plain-e", "e", {}, 0),
        ("checked-f", "f", check, QUARANTINED),
        ("checked-g", "g", check, QUARANTINED),
        ("plain-h", "h", {}, 0),
    ):
        fleets[name] = make_fleet(name, kind="node", capabilities=["train"], config=config)
        _fleet_of_nodes(fleets[name], prefix, 0, awaiting=awaiting)
    took = {name: _pass(fleet, member, project) for name, fleet in fleets.items()}
    without = took["plain-e"] + took["plain-h"]
    with_them = took["checked-f"] + took["checked-g"]
    held = set(
        CardHold.objects.filter(node__fleet=fleets["checked-f"]).values_list("uuid", flat=True)
    )
    assert not held & {f"GPU-f-{i:05d}-3" for i in range(QUARANTINED)}  # owed: never placed
    with capsys.disabled():
        print(
            f"\nH5: one pass of {JOBS} one-card jobs onto {NODES} nodes x 8 cards, two each: "
            f"{without / 2:.2f} s on a Fleet without a health check, {with_them / 2:.2f} s with "
            f"one ({QUARANTINED} nodes with a card owed its check) "
            f"({(with_them / without - 1) * 100:+.1f} %); "
            + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in took.items())
        )
