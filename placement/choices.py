"""The choices of placement's records and, beside each record's states, its lifecycle: the
moves those states allow, written once (``tuneplane.lifecycle``; ``move`` makes one, audited).

A job (training or lifecycle; on a cluster Fleet its manager's state read back)::

    queued ──► starting ──► running ──► succeeded | failed | cancelled
     ▲ ▲          │            │  │
     │ └──────────┴────────────┘  │   retried after a lost attempt or a missed gang
     │                            │   deadline (R9); a cluster manager's requeue
     │                            ▼
     └───────────────────── preempting ──► succeeded | failed | cancelled
                                           (Q6: stopped for a preemptor; queued again in
                                           its place once its members have ended)

    A cluster manager's own moves besides: queued ──► running | succeeded | failed, and
    preempting ──► running (requeued, and read running before it was read queued).
    Any state that has not ended may also end cancelled (R10).

An attempt; a member (``unknown``: its node is gone, R8)::

    starting ──► running ──► succeeded | failed | lost | cancelled | preempted  (an attempt)
    starting ──► running ──► succeeded | failed | cancelled | abandoned
        │   ▲       │   ▲
        └───┴► unknown ─┘──► succeeded | failed | lost | cancelled | abandoned   (a member)

A revision: ``live ──► retired | rolled_back | stopped``. A deployment and a playground
session: ``live ──► stopped``. An episode::

    queued ──► starting ──► running ──► succeeded | failed | timed_out | cancelled
      └──────────┴──► timed_out | cancelled; starting ──► succeeded | failed
"""

from django.db import models

from fleets.choices import FleetCapability
from tuneplane.lifecycle import Lifecycle

# Labels are the values: the admin shows the product page's own words.


class LifecycleKind(models.TextChoices):
    EVAL = "eval", "eval"
    EXPORT = "export", "export"
    MERGE = "merge", "merge"


# An eval needs a Fleet that promises eval; the other lifecycle jobs are training work.
LIFECYCLE_CAPABILITY = {
    LifecycleKind.EVAL: FleetCapability.EVAL,
    LifecycleKind.EXPORT: FleetCapability.TRAIN,
    LifecycleKind.MERGE: FleetCapability.TRAIN,
}


class DeploymentState(models.TextChoices):
    LIVE = "live", "live"
    STOPPED = "stopped", "stopped"


class RevisionState(models.TextChoices):
    """A revision on its way (S2): serving or rolling out; replaced by a newer one; rolled
    back (not Ready within its deadline); stopped with its deployment."""

    LIVE = "live", "live"
    RETIRED = "retired", "retired"
    ROLLED_BACK = "rolled_back", "rolled_back"
    STOPPED = "stopped", "stopped"


REVISION_LIFECYCLE = Lifecycle.of(
    "revision",
    {RevisionState.LIVE: {RevisionState.RETIRED, RevisionState.ROLLED_BACK, RevisionState.STOPPED}},
)
# A deployment's and a playground session's: live until stopped, never live again.
DEPLOYMENT_LIFECYCLE = Lifecycle.of("deployment", {DeploymentState.LIVE: {DeploymentState.STOPPED}})
SESSION_LIFECYCLE = Lifecycle.of(
    "playgroundsession", {DeploymentState.LIVE: {DeploymentState.STOPPED}}
)


class DeploymentStatus(models.TextChoices):
    """What a deployment reports (L2): computed from its revisions' nodes, never stored."""

    READY = "ready", "ready"
    DEGRADED = "degraded", "degraded"
    STOPPED = "stopped", "stopped"


class Refusal(models.TextChoices):
    """Why admission refused (P6). The first three are the product's, and quota a shared
    Fleet's (Q2); the last two say what the submitter has to add."""

    CAPABILITY = "capability", "capability"
    STATE = "state", "state"
    INVENTORY_FIT = "inventory_fit", "inventory_fit"
    QUOTA = "quota", "quota"
    FLEET_NOT_NAMED = "fleet_not_named", "fleet_not_named"
    NO_NODE_ANSWERING = "no_node_answering", "no_node_answering"


class JobState(models.TextChoices):
    """A job on a node Fleet (DESIGN §7): queued until the allocator gives it cards."""

    QUEUED = "queued", "queued"
    STARTING = "starting", "starting"
    RUNNING = "running", "running"
    PREEMPTING = "preempting", "preempting"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


JOB_ENDED = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)

# ``name`` is the audit action's prefix; a job's is its model's (trainingjob, lifecycle job).
JOB_LIFECYCLE = Lifecycle.of(
    "job",
    {
        JobState.QUEUED: {JobState.STARTING, JobState.RUNNING, *JOB_ENDED},
        JobState.STARTING: {JobState.QUEUED, JobState.RUNNING, *JOB_ENDED},
        JobState.RUNNING: {JobState.QUEUED, JobState.PREEMPTING, *JOB_ENDED},
        # Q6: its members stopped for a preemptor; queued again once they have ended, or
        # ended if they ended first on their own or it was cancelled meanwhile. A cluster
        # manager that requeued it may be read running again without a read of it queued.
        JobState.PREEMPTING: {JobState.QUEUED, JobState.RUNNING, *JOB_ENDED},
    },
)


class RunState(models.TextChoices):
    """An attempt's and a member's (DESIGN §7)."""

    STARTING = "starting", "starting"
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    UNKNOWN = "unknown", "unknown"
    LOST = "lost", "lost"
    CANCELLED = "cancelled", "cancelled"
    ABANDONED = "abandoned", "abandoned"
    PREEMPTED = "preempted", "preempted"  # an attempt's: stopped for a preemptor (Q6)


RUN_LIVE = (RunState.STARTING, RunState.RUNNING, RunState.UNKNOWN)


class EndClass(models.TextChoices):
    """H1: whose an attempt's end is — the machine's (``infrastructure``: its node gone or
    lost, a member vanished, a fatal fault on its cards, a gang peer's such end, the agent
    unable to start it) or the job's own (``user``: its exit, its OOM, its success, a cancel).
    Only a ``user`` end spends ``max_attempts`` (H2). "" while it runs, and for an attempt
    preempted (Q6: neither)."""

    INFRASTRUCTURE = "infrastructure", "infrastructure"
    USER = "user", "user"


_ATTEMPT_ENDS = {RunState.SUCCEEDED, RunState.FAILED, RunState.LOST, RunState.CANCELLED}
ATTEMPT_LIFECYCLE = Lifecycle.of(
    "attempt",
    {
        RunState.STARTING: {RunState.RUNNING, *_ATTEMPT_ENDS},
        # Only a running attempt is preempted (Q5: it has run its minimum runtime).
        RunState.RUNNING: {*_ATTEMPT_ENDS, RunState.PREEMPTED},
    },
)
_MEMBER_ENDS = {*_ATTEMPT_ENDS, RunState.ABANDONED}
MEMBER_LIFECYCLE = Lifecycle.of(
    "member",
    {
        # Given up ("lost") only once unknown: a member's node is gone before it is (R8).
        RunState.STARTING: {RunState.RUNNING, RunState.UNKNOWN, *_MEMBER_ENDS - {RunState.LOST}},
        RunState.RUNNING: {RunState.UNKNOWN, *_MEMBER_ENDS - {RunState.LOST}},
        RunState.UNKNOWN: {RunState.RUNNING, *_MEMBER_ENDS},
    },
)


class Cleanup(models.TextChoices):
    PENDING = "pending", "pending"
    CLEANED = "cleaned", "cleaned"


class EpisodeState(models.TextChoices):
    """An episode (S5): queued until placed; ends by its exit or its own timeout."""

    QUEUED = "queued", "queued"
    STARTING = "starting", "starting"
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    TIMED_OUT = "timed_out", "timed_out"
    CANCELLED = "cancelled", "cancelled"


EPISODE_ENDED = (
    EpisodeState.SUCCEEDED,
    EpisodeState.FAILED,
    EpisodeState.TIMED_OUT,
    EpisodeState.CANCELLED,
)
EPISODE_LIFECYCLE = Lifecycle.of(
    "episode",
    {
        EpisodeState.QUEUED: {
            EpisodeState.STARTING,
            EpisodeState.TIMED_OUT,
            EpisodeState.CANCELLED,
        },
        EpisodeState.STARTING: {EpisodeState.RUNNING, *EPISODE_ENDED},
        EpisodeState.RUNNING: set(EPISODE_ENDED),
    },
)

LIFECYCLES = (
    JOB_LIFECYCLE,
    ATTEMPT_LIFECYCLE,
    MEMBER_LIFECYCLE,
    REVISION_LIFECYCLE,
    DEPLOYMENT_LIFECYCLE,
    SESSION_LIFECYCLE,
    EPISODE_LIFECYCLE,
)
