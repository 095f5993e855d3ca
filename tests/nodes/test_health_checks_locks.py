"""H5 and H7 on real PostgreSQL row locks: the health-check sweep and a check's result each take
their Fleet's health breaker before any node, the order every telemetry flush takes them in —
so a flush holding a breaker and waiting for a node never meets a check holding that node and
waiting for the breaker (the deadlock the full suite met). Each test holds the breaker in a
transaction of its own, starts the check's writer in a thread, and sees the node still free
(NOWAIT) while the writer waits; released, the writer finishes."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from audit.services import Actor
from fleets.services import fleet_update
from nodes.choices import CommandKind, CommandState
from nodes.models import Node, NodeCommand
from nodes.services.checks import health_checks_run
from nodes.services.commands import Reported, node_command_report
from nodes.services.health import health_breakers_lock

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def checked_node(node_fleet, gpu_node, settings):
    settings.TUNEPLANE_HEALTH_BREAKER_SHARE = 1
    fleet_update(
        actor=Actor.system("test"),
        fleet=node_fleet,
        config={"health_check": {"command": "true", "timeout_seconds": 30}},
    )
    node = gpu_node(node_fleet, cards=1)
    Node.objects.filter(pk=node.pk).update(lease_expires_at=timezone.now() + timedelta(days=1))
    health_checks_run()
    return node


def in_thread(work) -> tuple[threading.Thread, list]:
    done: list = []

    def run():
        try:
            done.append(work())
        except Exception as error:  # asserted on below
            done.append(error)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, done


def node_free(node: Node) -> bool:
    """Whether another transaction can lock the node now, without waiting."""
    holder, free = [], []

    def probe():
        try:
            with transaction.atomic():
                Node.objects.select_for_update(no_key=True, nowait=True).get(pk=node.pk)
            free.append(True)
        except Exception:  # DatabaseError: could not obtain lock
            free.append(False)
        finally:
            connection.close()

    holder.append(threading.Thread(target=probe))
    holder[0].start()
    holder[0].join(10)
    return free == [True]


def breaker_held(node: Node, writer) -> tuple[bool, list]:
    """Hold the node's Fleet breaker, start ``writer``, and say whether the node was free
    while the writer waited; then let it finish."""
    release, holding = threading.Event(), threading.Event()

    def hold():
        try:
            with transaction.atomic():
                health_breakers_lock([node.fleet_id])
                holding.set()
                release.wait(20)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(10)
    thread, done = in_thread(writer)
    time.sleep(1.0)  # the writer is now waiting on the breaker, or holds the node
    waited = thread.is_alive()
    free = node_free(node)
    release.set()
    holder.join(20)
    thread.join(20)
    return waited and free, done


def test_H5_H7_the_sweep_takes_the_breaker_before_any_node(checked_node):
    later = timezone.now() + timedelta(seconds=31)  # the check has timed out
    ordered, done = breaker_held(checked_node, lambda: health_checks_run(now=later))
    assert ordered, "the sweep locked a node before its Fleet's breaker"
    assert done == [{"sent": 0, "timed_out": 1}]


def test_H5_H7_a_checks_result_takes_the_breaker_before_its_node(checked_node):
    (check,) = NodeCommand.objects.filter(node=checked_node, kind=CommandKind.START)

    def fails():
        node_command_report(
            node_id=checked_node.id, reported=Reported.of(check.pk, CommandState.FAILED, 1)
        )

    ordered, done = breaker_held(checked_node, fails)
    assert ordered, "a check's result locked its node before its Fleet's breaker"
    assert done == [None]
    assert Node.objects.get(pk=checked_node.pk).unhealthy_cards  # quarantined once free
