"""Where a cluster Fleet's machines come from: its cluster manager (DESIGN.md §6).

One small interface for every backend. A ``node`` Fleet's machines report over the control
stream and need no reading; ``slurm`` and ``kubernetes`` Fleets are read on a schedule into
a snapshot with its observation time, which placement judges by the same freshness rule
as node inventory (L1).
"""

import importlib

from fleets.choices import FleetKind

from .base import Backend, BackendError, JobSpec, Machine, OutcomeUnknown, job_state_is_final

# Each cluster kind's backend, imported when first used: a console without a Kubernetes
# Fleet never loads the Kubernetes client.
BACKENDS = {
    FleetKind.SLURM: ".slurm.SlurmBackend",
    FleetKind.KUBERNETES: ".kubernetes.KubernetesBackend",
}


def backend_for(fleet) -> Backend:
    """The backend of a cluster Fleet, from its config; a node Fleet has none to read."""
    if fleet.kind not in BACKENDS:
        raise ValueError(f"a {fleet.kind} Fleet has no cluster manager to read")
    module, _, name = BACKENDS[fleet.kind].rpartition(".")
    return getattr(importlib.import_module(module, __name__), name).from_config(fleet.config)


__all__ = [
    "Backend",
    "BackendError",
    "JobSpec",
    "Machine",
    "OutcomeUnknown",
    "backend_for",
    "job_state_is_final",
]
