"""R16: every member is bounded, and every bound is in its start — cpus, memory, pids, the
log's size, the scratch quota and the stop grace — for each kind of member: a job's, a
replica, a playground session's and an episode's. Each start is read back as the agent reads
it (MemberSpec.parse). Issue 47: dropping ``log_bytes`` from the start passed every
in-process test; only cpus and memory were checked."""

import pytest

from audit.services import Actor
from nodes.agent.wire import MemberSpec
from nodes.models import NodeCommand
from placement.models import Member
from placement.services import episodes, submission
from placement.services.allocator import allocate
from tests.conftest import SERVE

BOUNDS = {
    "TUNEPLANE_MEMBER_PIDS": 321,
    "TUNEPLANE_MEMBER_LOG_BYTES": 7 << 20,
    "TUNEPLANE_MEMBER_SCRATCH_BYTES": 3 << 30,
    "TUNEPLANE_STOP_GRACE": 17,
}


@pytest.fixture
def lab(make_fleet, gpu_node, settings):
    for name, value in BOUNDS.items():
        setattr(settings, name, value)
    fleet = make_fleet("gpu-lab", kind="node", capabilities=["train", "serve", "env"])
    gpu_node(fleet, cpu_budget=32, memory_budget_bytes=256 * 2**30)
    return fleet


def submit_each(member) -> dict[str, dict]:
    """One of each kind of member, its records' filter on Member."""
    actor, named = Actor.of_user(member), {"project": "ml"}
    job = submission.training_job_submit(
        actor=actor, **named, name="train", command=["true"], cards=2
    )
    deployment = submission.deployment_submit(
        actor=actor, **named, name="chat", cards=2, fleet="gpu-lab", **SERVE
    )
    session = submission.playground_session_submit(
        actor=actor,
        **named,
        name="try",
        **{**SERVE, "port": 8001},  # a port per node (S1)
    )
    environment = submission.environment_submit(
        actor=actor, **named, name="env", manifest={"fleet": "gpu-lab"}
    )
    episode = episodes.episode_start(actor=actor, environment=environment, command=["true"])
    return {
        "job": {"attempt__training_job": job},
        "replica": {"revision__deployment": deployment},
        "session": {"session": session},
        "episode": {"episode": episode},
    }


def test_R16_every_start_carries_every_bound_for_every_kind_of_member(lab, member):
    kinds = submit_each(member)
    allocate(fleet_id=lab.id)
    for kind, owned in kinds.items():
        [placed] = Member.objects.filter(**owned)
        spec = MemberSpec.parse(NodeCommand.objects.get(pk=placed.command_id).payload)
        bounds = (spec.pids, spec.log_bytes, spec.scratch_bytes, spec.grace)
        assert bounds == (321, 7 << 20, 3 << 30, 17.0), kind
        # cpus and memory: its cards' share of the node's budgets (32 CPUs, 256 GiB for 8
        # cards), or 1 CPU and 2 GiB with no cards
        cards = len(placed.cards)
        expected = (4.0 * cards, 32 * 2**30 * cards) if cards else (1.0, 2 * 2**30)
        assert (spec.cpus, spec.memory_bytes) == expected, kind
        assert (placed.cpus, placed.memory_bytes) == expected, kind
