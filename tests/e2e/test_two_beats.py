"""Two beats at once for a minute (an operator's mistake): every sweep runs twice as often,
and every liveness transition and its audit event still happen exactly once."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from nodes.choices import SchedulingState
from nodes.models import Node
from tests.conftest import H100_INVENTORY
from tuneplane.schedule import seed_schedule

from .agents import running_gateway
from .console import console_env
from .running import SHORT, celery, stopped

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]

NODES = 24
MINUTE = 60


def test_two_beats_for_a_minute_make_every_transition_once(
    require_redis, tmp_path, console_pki, make_fleet, settings
):
    settings.TUNEPLANE_SWEEP_INTERVAL = 1  # the schedule seeded below: a sweep a second
    fleet = make_fleet("gpu-lab", kind="node", capabilities=["train", "serve"])
    now = timezone.now()
    # Silent since staggered moments, so that transitions keep coming during the minute.
    nodes = Node.objects.bulk_create(
        [
            Node(
                fleet=fleet,
                hostname=f"n{i}",
                scheduling_state=SchedulingState.SCHEDULABLE,
                inventory=H100_INVENTORY,
                inventory_observed_at=now,
                last_seen_at=now + timedelta(seconds=2 * i),
            )
            for i in range(NODES)
        ]
    )
    seed_schedule()
    env = console_env(tmp_path, REDIS_URL=require_redis, **SHORT)
    with running_gateway(tmp_path, console_pki, REDIS_URL=require_redis, **SHORT):
        worker = celery("worker", "-l", "INFO", "--pool", "solo", env=env)
        beats = [
            celery("beat", "-l", "INFO", "-s", str(tmp_path / f"beat-{n}"), env=env) for n in (1, 2)
        ]
        try:
            started = time.monotonic()
            answered = False
            while time.monotonic() - started < MINUTE:
                if not answered and time.monotonic() - started > MINUTE / 2:
                    # Half of them answer again half-way: quiet → ok, once each.
                    Node.objects.filter(pk__in=[n.pk for n in nodes[::2]]).update(
                        last_seen_at=timezone.now() + timedelta(seconds=MINUTE)
                    )
                    answered = True
                time.sleep(1)
        finally:
            stopped(*beats, worker)
            output = "".join(process.log.read_text() for process in (*beats, worker))
    sent = output.count("Sending due task Liveness sweep")
    assert sent >= 1.5 * MINUTE, f"two beats should have sent ~{2 * MINUTE} sweeps: {sent}"
    events = AuditEvent.objects.filter(
        target_type="nodes.node", action__in=["node.quiet", "node.answering", "node.gone"]
    ).order_by("id")
    assert events.count() > NODES  # the minute did see transitions
    flags: dict[tuple, str] = {}
    gone: set[str] = set()
    for event in events:
        if event.action == "node.gone":
            assert event.target_id not in gone, f"{event.target_id} gone twice"
            gone.add(event.target_id)
            continue
        key = (event.target_id, event.after["capability"])
        shown = event.after["liveness"]
        assert flags.get(key, "ok") != shown, f"{key} marked {shown} twice in a row"
        assert event.before["liveness"] == flags.get(key, "ok")
        flags[key] = shown
    for node in Node.objects.filter(pk__in=[n.pk for n in nodes]):
        for capability in ("train", "serve"):
            assert flags.get((node.pk, capability), "ok") == (
                "quiet" if getattr(node, f"quiet_{capability}") else "ok"
            )
        assert (node.scheduling_state == SchedulingState.GONE) == (node.pk in gone)
