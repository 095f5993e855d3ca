from django.db import models

from fleets.choices import FleetCapability
from tuneplane.lifecycle import Lifecycle

# Labels are the values: the admin shows the product page's own words.


class SchedulingState(models.TextChoices):
    ENROLLED = "enrolled", "enrolled"
    SCHEDULABLE = "schedulable", "schedulable"
    CORDONED = "cordoned", "cordoned"
    DRAINING = "draining", "draining"
    DRAINED = "drained", "drained"
    GONE = "gone", "gone"
    REMOVED = "removed", "removed"


# A node's scheduling state, as its services move it. A cordon is a record of its own (D1,
# L6); ``cordoned`` is a cluster manager's word for its machines, never a node row's.
#
#   enrolled ──► schedulable ◄──────────► gone ──► removed   (by force: D3)
#                  ▲      │                ▲  │
#           resume │      ▼ drain          │  ▼
#                  └── draining ──► drained ──► removed      (D2)
#
# Every state but removed may be drained (D1): drained at once when nothing runs, else
# draining until its last command is cleaned up. A silent node goes gone, unless it is drained
# (switched off, as expected); a gone one answering again is schedulable, or draining or
# drained again as its drain says. A draining or drained node resumed takes work again
# (Slurm's RESUME). Removed is the end (D4).
NODE_LIFECYCLE = Lifecycle.of(
    "node",
    {
        SchedulingState.ENROLLED: {
            SchedulingState.SCHEDULABLE,
            SchedulingState.GONE,
            SchedulingState.DRAINING,
            SchedulingState.DRAINED,
        },
        SchedulingState.SCHEDULABLE: {
            SchedulingState.GONE,
            SchedulingState.DRAINING,
            SchedulingState.DRAINED,
        },
        SchedulingState.GONE: {
            SchedulingState.SCHEDULABLE,
            SchedulingState.DRAINING,
            SchedulingState.DRAINED,
            SchedulingState.REMOVED,
        },
        SchedulingState.DRAINING: {
            SchedulingState.DRAINED,
            SchedulingState.GONE,
            SchedulingState.SCHEDULABLE,
        },
        SchedulingState.DRAINED: {SchedulingState.SCHEDULABLE, SchedulingState.REMOVED},
    },
    field="scheduling_state",
)

# What a node is in while it is leaving (D1): it counts toward no admission's fit (P8).
LEAVING = (SchedulingState.DRAINING, SchedulingState.DRAINED, SchedulingState.REMOVED)


class CordonSource(models.TextChoices):
    """Who cordoned: an operator decided, or the system observed (L6). Never one flag."""

    OPERATOR = "operator", "operator"
    STORAGE = "storage", "storage"
    # A member's processes outlived SIGKILL by a minute (stuck in the kernel): the node takes
    # no new work until they are gone, as Slurm drains such a node (DESIGN §7).
    UNKILLABLE = "unkillable", "unkillable"
    # Every card of the node is unhealthy by its telemetry (a fatal XID, uncorrectable ECC
    # errors rising, missing): lifted by itself when a card is healthy again.
    GPU_HEALTH = "gpu-health", "gpu-health"


class CommandState(models.TextChoices):
    PENDING = "pending", "pending"  # recorded, not yet acknowledged by the node
    RUNNING = "running", "running"  # the node persisted it and started it
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    LOST = "lost", "lost"  # the console had it running; the node, reconnecting, did not know it


# pending ──► running ──► succeeded | failed
#    │          │
#    └──────────┴──► lost ──► running | succeeded | failed
# "lost": the console's word for a command its node no longer knows (L5, R8) or left behind
# on a node removed by force (D3); a node that comes back and reports it has the last word.
# A command's cleanup (a member's, R7) is a column of its own, not a state.
COMMAND_LIFECYCLE = Lifecycle.of(
    "node_command",
    {
        CommandState.PENDING: {
            CommandState.RUNNING,
            CommandState.SUCCEEDED,
            CommandState.FAILED,
            CommandState.LOST,
        },
        CommandState.RUNNING: {CommandState.SUCCEEDED, CommandState.FAILED, CommandState.LOST},
        CommandState.LOST: {CommandState.RUNNING, CommandState.SUCCEEDED, CommandState.FAILED},
    },
)

# The capabilities with a liveness rule of their own (L2–L4).
LIVENESS_CAPABILITIES = (FleetCapability.TRAIN, FleetCapability.SERVE, FleetCapability.ENV)

# A command in one of these may still be running on its node: drain waits for it.
ACTIVE_COMMAND_STATES = (CommandState.PENDING, CommandState.RUNNING)


class CommandKind(models.TextChoices):
    RUN = "run", "run"  # a process under the agent: payload {"argv": [...]}
    # A job's member (placement's allocator writes these, DESIGN §7): start it with its
    # cards, stop it (SIGTERM, SIGKILL after the grace), clean up what it left (R7).
    START = "start", "start"
    STOP = "stop", "stop"
    CLEANUP = "cleanup", "cleanup"
