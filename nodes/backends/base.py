"""The interface a backend keeps, and the one shape of a machine every backend reports."""

from dataclasses import asdict, dataclass, field
from typing import Protocol, runtime_checkable

from ..choices import SchedulingState

# A job in one of these, in its manager's words (Slurm's, KubeRay's), is not read again.
FINAL_JOB_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "SUCCEEDED",
        "STOPPED",
    }
)


def job_state_is_final(state: str) -> bool:
    return state.upper() in FINAL_JOB_STATES


class BackendError(Exception):
    """The cluster manager did not answer, refused us, or answered with an error.

    The message is for the Fleet page: what failed, in the manager's words, never a token.
    """


class OutcomeUnknown(BackendError):
    """The request may have reached the manager, but no answer came back (a timeout, a
    connection dropped mid-call): a submit may have been taken. Resume it, never fail it."""


@dataclass(frozen=True)
class Machine:
    """One machine as its manager reports it, in the terms the console reads every Fleet by.

    ``state`` is a scheduling state: schedulable, cordoned (a cordon the console did not
    make: Slurm's DRAIN, Kubernetes' unschedulable) or gone (down, not Ready).
    """

    name: str
    cards: list[dict]  # [{"name": <the manager's card name>, "count": n}], mapped by J4
    cards_used: int = 0
    state: str = SchedulingState.SCHEDULABLE
    reason: str = ""  # the manager's own words for a cordon or an absence
    detail: dict = field(default_factory=dict)  # backend-specific, shown as is

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class JobSpec:
    """What a backend needs to run an admitted job; the job record is the product (P7)."""

    name: str
    script: str
    series: str  # the card name the manager knows, or "" for any
    cards: int  # per node
    nodes: int = 1
    key: str = ""  # the console's key for it, the same at every attempt (see Backend.resume)


@dataclass(frozen=True)
class JobRead:
    """A job as its manager reports it: its state in the manager's words, and what says whose
    its end was (H8: placement.faults.manager_end_class reads these)."""

    state: str
    reason: str = ""  # Slurm's state_reason, KubeRay's status.reason
    message: str = ""  # KubeRay's status.message (Ray's job message)
    restarts: int = 0  # Slurm's restart_cnt: the times the manager requeued it itself


class Backend(Protocol):
    """Reads a cluster and hands it jobs. Every call may raise BackendError."""

    def read(self) -> list[Machine]:
        """Every machine of the Fleet now."""

    def submit(self, job: JobSpec) -> str:
        """Hands the job to the manager; returns the manager's id for it."""

    def resume(self, job: JobSpec) -> str:
        """An earlier attempt to hand ``job`` over may have reached the manager (the console
        stopped before recording its answer): the id of the job with ``job.key`` if the
        manager has it, else what ``submit`` returns. Never a second job."""

    def job_state(self, job_id: str) -> str:
        """The manager's state of a job it was handed, in its own words (COMPLETED, …)."""

    def job_read(self, job_id: str) -> JobRead:
        """``job_state`` with the manager's reason and message, and its own restarts."""

    def cancel(self, job_id: str) -> None:
        """Asks the manager to stop a job it was handed (R10); one already gone is done.
        Its end is read back by ``job_state`` like any other."""


@runtime_checkable
class ListsJobStates(Protocol):
    """A backend that reads the states of all the console's jobs at once (Kubernetes: one
    paged list of RayJobs). The tracking pass uses it where a backend has it; a backend
    without it is read a job at a time (``job_read``)."""

    def job_states(self) -> dict[str, str]:
        """Every job of the console's that the manager has, by id, with its state as
        ``job_state`` reads it. A job missing from it is not said to be gone: read it alone."""
