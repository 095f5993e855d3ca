"""A member as the agent keeps it in its state dir: one JSON file per member, written before
its process starts (R4) and after every change, so that an agent that restarts knows what
each of its members is, holds and was asked (R6)."""

from dataclasses import dataclass, field

RUNNING, SUCCEEDED, FAILED = "running", "succeeded", "failed"
START = "start"  # the command kind that makes a member


@dataclass
class Member:
    command_id: str  # the member's id: its start command's
    kind: str = START
    argv: list = field(default_factory=list)  # its first word, for the log
    state: str = RUNNING
    exit_code: int | None = None
    # Its process group's leader, and that process's start time in /proc (against pid reuse).
    pid: int | None = None
    started: str | None = None
    # Why it ended, whether what it left is gone (R7), its confinement (R5), the boot it
    # started in (R6), its cards, and a stop under way (when asked, its grace, when killed).
    reason: str = ""
    cleaned: bool = False
    confinement: str = ""
    boot_id: str = ""
    cards: list = field(default_factory=list)
    stop_at: float | None = None
    grace: float = 30.0
    killed_at: float | None = None
    # A confined member's stop whose SIGTERM found nothing in its cgroup (its runtime had not
    # put its init there yet): sent at the first tick that finds something there (R10).
    term_pending: bool = False
    cleanup_wanted: bool = False
    # The runtime a member in a container runs under ("docker", "podman"); "": a process.
    container: str = ""
    # A confined member's own address, in its network namespace (R19): what probes ask.
    address: str = ""
    # The OCI runtime a confined process member runs under (R18: its absolute path); "": none.
    sandbox: str = ""
    # The unprivileged uid it runs as (R11); None: the agent's own user.
    uid: int | None = None
    # Its log is cut to its newest part past this many bytes (R16); None: never.
    log_bytes: int | None = None
    # Past this size its scratch dir stops it (R16), and the limit it hit is why it ended.
    scratch_bytes: int | None = None
    limit_hit: str = ""
    # What a confined member's scratch is ("scratch 50 MiB ext4", "a plain dir"), R21.
    scratch_fs: str = ""
    # A replica's: its port and readiness path, the start it restarts from, whether its
    # probe passes, restarts so far, the probe's error or why it restarts, and when.
    serve: dict | None = None
    spec: dict | None = None
    ready: bool = False
    restarts: int = 0
    detail: str = ""
    restart_at: float | None = None
    backoff: int = 0
    launched_at: float | None = None
    # H4: when the agent last saw its checkpoint mark change (its own clock, never the
    # file's times, which the member sets), and what it saw: (mtime_ns, size, inode).
    checkpoint_at: float | None = None
    checkpoint_seen: list | None = None
    # A container member with a memory limit: the node's OOM-kill count at its launch
    # (containers.oom_ended).
    oom_kills: int | None = None
    # H5: a health check's: at its end, the tail of its output is its detail.
    output_tail: bool = False

    def reported(self) -> tuple:
        """What the console is told: a change in any of it is reported."""
        return (
            self.state,
            self.exit_code,
            self.reason,
            self.cleaned,
            self.confinement,
            self.ready,
            self.restarts,
            self.detail,
            self.checkpoint_at,
        )

    @property
    def holds_cards(self) -> bool:
        return not self.cleaned

    @property
    def stopping(self) -> bool:
        return self.stop_at is not None or self.cleanup_wanted

    @property
    def serving(self) -> bool:
        """A replica whose process runs now: what the readiness probe asks."""
        return (
            self.serve is not None
            and self.state == RUNNING
            and self.restart_at is None
            and self.stop_at is None
        )
