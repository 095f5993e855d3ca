"""R10 against the allocator: a cancel that commits while an allocation pass is under way is
never overwritten by it (the pass locks the queued jobs' rows). Two real database
connections on PostgreSQL, one a thread's."""

import threading
import time

import pytest
from django.db import connection, transaction
from django.utils import timezone

from placement.models import Attempt, TrainingJob
from placement.services.allocator import allocate

from .test_allocator import job

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_R10_a_cancel_racing_an_allocation_pass_is_not_overwritten(
    node_fleet,
    gpu_node,
    member,
):
    gpu_node(node_fleet)
    record = job(member, cards=1)
    done = {}

    def allocator():
        try:
            done["result"] = allocate(fleet_id=node_fleet.id)
        finally:
            connection.close()

    with transaction.atomic():
        locked = TrainingJob.objects.select_for_update().get(pk=record.pk)
        thread = threading.Thread(target=allocator)
        thread.start()
        time.sleep(1)  # the pass is under way, waiting on this row (or reading past it)
        locked.state, locked.reason = "cancelled", "cancelled"
        locked.cancel_requested_at = locked.ended_at = timezone.now()
        locked.save()
    thread.join(30)
    assert done["result"] == {"allocated": 0, "waiting": 0, "preempted": 0}
    assert TrainingJob.objects.get(pk=record.pk).state == "cancelled"
    assert not Attempt.objects.exists()
