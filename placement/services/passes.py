"""Asking for an allocation pass: what every writer that frees cards or queues work calls, in
a module of its own so that the pass itself (placement.services.allocator) may use those
writers — preemption stops its victims through runs' and members' writers — without a cycle."""

from celery import current_app
from django.db import transaction

ALLOCATE_TASK = "placement.allocate"


def allocate_on_commit(fleet_id: str) -> None:
    """Something changed for a node Fleet (a job admitted, cards released): a pass soon, in
    a worker. The beat's pass over every Fleet is the safety net."""
    transaction.on_commit(lambda: current_app.tasks[ALLOCATE_TASK].delay(fleet_id))
