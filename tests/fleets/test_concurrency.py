"""Races against real PostgreSQL transactions, with real threads."""

import itertools
import threading

import pytest
from django.db import connection

from audit.models import AuditEvent
from audit.services import Actor
from fleets.models import Fleet
from fleets.services import fleet_create, fleet_update
from tuneplane.errors import Conflict

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RACERS = 12


def race(target, count=RACERS):
    barrier = threading.Barrier(count)
    results = [None] * count

    def run(index):
        try:
            barrier.wait()
            results[index] = target(index)
        except Exception as exc:  # collected and asserted on below
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_concurrent_creates_of_one_id_make_exactly_one_fleet():
    assert connection.vendor == "postgresql"
    results = race(
        lambda i: fleet_create(
            actor=Actor.system(f"racer-{i}"), id="gpu-lab", kind="node", capabilities=["train"]
        )
    )
    created = [r for r in results if isinstance(r, Fleet)]
    refused = [r for r in results if isinstance(r, Conflict)]
    assert len(created) == 1 and len(refused) == RACERS - 1, results
    assert Fleet.objects.count() == 1
    assert AuditEvent.objects.filter(action="fleet.created").count() == 1


def test_concurrent_updates_are_serialised_and_each_audited():
    fleet = fleet_create(actor=Actor.system("t"), id="gpu-lab", kind="node")
    states = ["draining", "disabled", "active"] * 4
    race(lambda i: fleet_update(actor=Actor.system(f"racer-{i}"), fleet=fleet, state=states[i]))
    events = list(AuditEvent.objects.filter(action="fleet.updated").order_by("at", "id"))
    # Each event's "before" is the previous event's "after": no update was lost.
    for earlier, later in itertools.pairwise(events):
        assert earlier.after["state"] == later.before["state"]
    assert Fleet.objects.get().state == (events[-1].after["state"] if events else "active")
