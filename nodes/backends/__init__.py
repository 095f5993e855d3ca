"""Where a cluster Fleet's machines come from: its cluster manager (DESIGN.md §6).

One small interface for every backend. A ``node`` Fleet's machines report over the control
stream and need no reading; ``slurm`` and ``kubernetes`` Fleets are read on a schedule into
a snapshot with its observation time, which placement judges by the same freshness rule
as node inventory (L1).
"""

from .base import (Backend, BackendError, JobSpec, Machine, OutcomeUnknown, backend_for,
                   job_state_is_final)

__all__ = ["Backend", "BackendError", "JobSpec", "Machine", "OutcomeUnknown", "backend_for",
           "job_state_is_final"]
