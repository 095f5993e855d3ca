"""R1 with two allocators at once: two real processes (as two workers, or two beats, would
be) run allocation passes over one Fleet's queue at the same moment, on the real database.
No card is handed out twice, no job gets two attempts, and neither process fails."""

import subprocess
import sys
import time
from collections import Counter

import pytest

from placement.models import Attempt, CardHold, Member, TrainingJob
from tests.placement.test_allocator import job

from .console import ROOT, console_env

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

PASSES = """
import os, time
import django
django.setup()
from placement.services.allocator import allocate
while not os.path.exists({go!r}):
    time.sleep(0.005)
done = [allocate(fleet_id="gpu-lab")["allocated"] for _ in range(20)]
print(sum(done))
"""


def test_R1_two_allocators_at_once_never_hand_out_one_card_twice(
    node_fleet,
    gpu_node,
    member,
    tmp_path,
):
    for n in range(4):
        gpu_node(node_fleet, cards=8, address=f"10.0.0.{n}:1")
    jobs = [job(member, f"j{n}", cards=n % 3 + 1) for n in range(30)]  # 60 cards for 32
    go = tmp_path / "go"
    env = {**console_env(tmp_path), "DJANGO_SETTINGS_MODULE": "tuneplane.settings"}
    allocators = [
        subprocess.Popen(
            [sys.executable, "-c", PASSES.format(go=str(go))],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    time.sleep(2)  # both started and waiting
    go.touch()
    outputs = [process.communicate(timeout=120) for process in allocators]
    for process, (_, error) in zip(allocators, outputs, strict=True):
        assert process.returncode == 0, error
    allocated = sum(int(out.strip().splitlines()[-1]) for out, _ in outputs)

    holds = list(CardHold.objects.values_list("node_id", "index"))
    assert len(holds) == len(set(holds)) <= 32
    cards = Counter((m.node_id, c["index"]) for m in Member.objects.all() for c in m.cards)
    assert cards and max(cards.values()) == 1  # each card in one member only
    per_job = Counter(Attempt.objects.values_list("training_job_id", flat=True))
    assert per_job and max(per_job.values()) == 1
    assert allocated == len(per_job) == TrainingJob.objects.filter(state="starting").count()
    assert sum(len(m.cards) for m in Member.objects.all()) == len(holds)
    assert len(jobs) > allocated
