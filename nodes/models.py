import secrets
import uuid
from datetime import timedelta

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

from fleets.models import Fleet

from .choices import LIVENESS_CAPABILITIES, CommandKind, CommandState, CordonSource, SchedulingState


def quiet_threshold(capability: str) -> timedelta:
    """How long a node may be silent before the capability treats it as quiet (L2–L4)."""
    return timedelta(seconds=getattr(settings, f"TUNEPLANE_QUIET_{capability.upper()}"))


def new_node_id() -> str:
    """Console-issued and unguessable (128 bits); never derived from an address."""
    return "n-" + secrets.token_hex(16)


class HardwareSeries(models.Model):
    """What a job pins: ``h100``, ``a100-80gb``. Card names map onto it through CardAlias."""

    # With a letter: a key of digits alone ("4090") reads as an array index in a JSON path,
    # and nodes' cards are kept per series slug in JSON.
    slug = models.SlugField(
        max_length=63,
        unique=True,
        validators=[RegexValidator(r"[a-z]", "A series slug needs a letter, e.g. rtx-4090.")],
    )
    name = models.CharField(max_length=200)
    vendor = models.CharField(max_length=32, blank=True)

    class Meta:
        ordering = ["slug"]
        verbose_name_plural = "hardware series"

    def __str__(self) -> str:
        return self.slug


class CardAlias(models.Model):
    """An exact card name as machines report it. No series yet means an admin has to map it."""

    name = models.CharField(max_length=200, unique=True)
    series = models.ForeignKey(
        HardwareSeries, null=True, blank=True, on_delete=models.PROTECT, related_name="aliases"
    )
    first_seen_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "card name"

    def __str__(self) -> str:
        return self.name


class Node(models.Model):
    """A machine of a node Fleet, known by the id the console issued it (J3, J5)."""

    id = models.CharField(primary_key=True, max_length=40, default=new_node_id, editable=False)
    # Only a removed node outlives its Fleet (F7): detached as the Fleet is deleted, it keeps
    # that Fleet's id as text, which a new Fleet of the same id does not claim.
    fleet = models.ForeignKey(
        Fleet, null=True, blank=True, on_delete=models.SET_NULL, related_name="nodes"
    )
    former_fleet = models.CharField(max_length=63, blank=True, default="")
    hostname = models.CharField(max_length=253, blank=True)
    # Where it answers. Two records may share one: an address is not an identity.
    address = models.CharField(max_length=300, blank=True, db_index=True)
    # machine-id and GPU UUIDs, hashed: a hint that two records are one machine, never identity.
    fingerprint = models.CharField(max_length=64, blank=True, db_index=True)
    agent_version = models.CharField(max_length=64, blank=True)
    scheduling_state = models.CharField(
        max_length=16, choices=SchedulingState.choices, default=SchedulingState.ENROLLED
    )
    inventory = models.JSONField(default=dict, blank=True)
    inventory_observed_at = models.DateTimeField(null=True, blank=True)
    # The digest of the InventoryReport ``inventory`` holds, as the node computes it
    # (Heartbeat.inventory_digest); empty once anything else has changed ``inventory``.
    inventory_digest = models.CharField(max_length=64, blank=True, default="")
    last_seen_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # Per-capability liveness, set and cleared by the liveness sweep (L2, L3): observations,
    # apart from the scheduling state an operator decides.
    quiet_train = models.BooleanField(default=False)
    quiet_serve = models.BooleanField(default=False)
    quiet_env = models.BooleanField(default=False)
    # Kept beside their sources in the same transactions, so that admission reads one row
    # a node and never unpacks JSON or joins sessions (P6's "at once" at 10,000 nodes):
    # its open control session's lease (L1), and its cards per mapped series (J4) and in all.
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    series_cards = models.JSONField(default=dict, blank=True)
    card_count = models.PositiveIntegerField(default=0)
    # Cards its telemetry judged unhealthy, by UUID ({"index", "name", "reason", "since"}):
    # left out of series_cards and card_count above and of what the allocator holds.
    unhealthy_cards = models.JSONField(default=dict, blank=True)
    # H5: on a Fleet with a health check, each card's last check by UUID (nodes.checks): a
    # card takes new work only while its state is "passed".
    card_checks = models.JSONField(default=dict, blank=True)
    # A drain is an operator's decision with its who, why and until when (D1): the deadline
    # kills nothing; once passed, the node shows overdue and the audit log marks it once.
    drain_reason = models.CharField(max_length=200, blank=True)
    drain_by = models.CharField(max_length=150, blank=True)
    drain_started_at = models.DateTimeField(null=True, blank=True)
    drain_deadline = models.DateTimeField(null=True, blank=True)
    drain_overdue_at = models.DateTimeField(null=True, blank=True)
    # When the last control session ended and why: kept here, since last_seen_at alone does
    # not say whether the stream was closed or went silent.
    last_session_closed_at = models.DateTimeField(null=True, blank=True)
    last_session_close_reason = models.CharField(max_length=200, blank=True)
    # Stray commands (L5) beyond the most recent TUNEPLANE_STRAY_COMMANDS_KEPT: dropped, counted.
    strays_dropped = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    removed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["fleet_id", "hostname", "id"]
        indexes = [
            models.Index(
                fields=["last_seen_at"],
                condition=models.Q(quiet_train=True)
                | models.Q(quiet_serve=True)
                | models.Q(quiet_env=True),
                name="node_quiet_last_seen",
            )
        ]
        constraints = [
            models.CheckConstraint(
                name="node_detached_only_when_removed",
                violation_error_message="Only a removed node is without its Fleet, and it "
                "keeps that Fleet's id.",
                condition=models.Q(fleet__isnull=False, former_fleet="")
                | (
                    models.Q(fleet__isnull=True, scheduling_state=SchedulingState.REMOVED)
                    & ~models.Q(former_fleet="")
                ),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.hostname or self.id} ({self.id})"

    def is_quiet(self, capability: str, now) -> bool:
        """Silent longer than the capability's threshold: a pure time computation."""
        return self.last_seen_at is None or now - self.last_seen_at > quiet_threshold(capability)

    def scheduling_shown(self, cordons) -> str:
        """The state an operator reads: a schedulable node with any cordon shows cordoned."""
        if cordons and self.scheduling_state == SchedulingState.SCHEDULABLE:
            return SchedulingState.CORDONED
        return self.scheduling_state

    def liveness(self) -> dict[str, str]:
        """Per liveness capability its Fleet declares, as the sweep last judged it (L2–L4);
        none once its Fleet is deleted."""
        capabilities = self.fleet.capabilities if self.fleet_id is not None else []
        return {
            capability: "quiet" if getattr(self, f"quiet_{capability}") else "ok"
            for capability in capabilities
            if capability in LIVENESS_CAPABILITIES
        }

    def card_names(self) -> list[str]:
        return [card["name"] for card in self.inventory.get("cards", [])]


class NodeTelemetry(models.Model):
    """A node's latest telemetry sample, as its gateway last stored it: the latest only (the
    history is Prometheus's: each gateway exports its nodes' samples as metrics). Each card
    as its CardSample says, plus when a fault was last seen on it and whether it is missing."""

    node = models.OneToOneField(
        Node, on_delete=models.CASCADE, primary_key=True, related_name="telemetry"
    )
    observed_at = models.DateTimeField()
    # When the cards were last read: a sample whose probe failed renews the host only.
    cards_observed_at = models.DateTimeField(null=True, blank=True)
    source = models.CharField(max_length=16, blank=True)
    host = models.JSONField(default=dict, blank=True)
    cards = models.JSONField(default=list, blank=True)

    class Meta:
        verbose_name_plural = "node telemetry"

    def __str__(self) -> str:
        return f"telemetry of {self.node_id}"


class NodeCredential(models.Model):
    """A certificate the console issued a node: serial, fingerprint, lifetime; never a key."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="credentials")
    serial = models.CharField(max_length=64, unique=True)
    fingerprint_sha256 = models.CharField(max_length=64, unique=True)
    not_before = models.DateTimeField()
    not_after = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-not_after"]


class JoinToken(models.Model):
    """Single-use, expiring, stored only as a hash (J2). The whole authorization of a join."""

    PREFIX = "tpj_"

    fleet = models.ForeignKey(Fleet, on_delete=models.CASCADE, related_name="join_tokens")
    prefix = models.CharField(max_length=16)
    digest = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    node = models.OneToOneField(
        Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="join_token"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… for {self.fleet_id}"


class GatewayReplica(models.Model):
    """A gateway process, as it announces itself: when it started, and when it last said it
    was still listening. The liveness sweep reads these to tell a console that heard nothing
    from a fleet that said nothing (a console outage is not a fleet outage)."""

    name = models.CharField(primary_key=True, max_length=300)
    started_at = models.DateTimeField()
    seen_at = models.DateTimeField()

    def __str__(self) -> str:
        return self.name


class ControlSession(models.Model):
    """One control stream from a node to a gateway replica; its lease is renewed by heartbeats.

    A closed session is not evidence that anything the node runs has stopped (L5).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="sessions")
    gateway = models.CharField(max_length=200)
    agent_version = models.CharField(max_length=64, blank=True)
    opened_at = models.DateTimeField()
    last_heartbeat_at = models.DateTimeField()
    lease_expires_at = models.DateTimeField(db_index=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    close_reason = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-opened_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["node"],
                condition=models.Q(closed_at__isnull=True),
                name="one_open_session_per_node",
            ),
        ]

    def __str__(self) -> str:
        return f"session {self.id} of {self.node_id}"


class NodeCordon(models.Model):
    """One reason a node takes no new work. At most one per source (L6).

    An operator cordon is a decision and is lifted only by an operator; a
    storage cordon is an observation, set and lifted by what the node reports.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="cordons")
    source = models.CharField(max_length=16, choices=CordonSource.choices)
    reason = models.CharField(max_length=200)
    created_at = models.DateTimeField()
    created_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(fields=["node", "source"], name="one_cordon_per_source"),
        ]

    def __str__(self) -> str:
        return f"{self.source} cordon on {self.node_id}: {self.reason}"


def new_command_id() -> str:
    return "c-" + secrets.token_hex(16)


class NodeCommand(models.Model):
    """Work the console asked a node to do, and the last state the node reported (L5)."""

    id = models.CharField(primary_key=True, max_length=40, default=new_command_id, editable=False)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="commands")
    kind = models.CharField(max_length=32, choices=CommandKind.choices)
    payload = models.JSONField(default=dict)
    state = models.CharField(
        max_length=16, choices=CommandState.choices, default=CommandState.PENDING, db_index=True
    )
    exit_code = models.IntegerField(null=True, blank=True)
    # A member's (kind start): why it ended in the node's words, when the node confirmed
    # everything it left is gone (its cards are held till then, R7), its confinement (R5).
    reason = models.CharField(max_length=32, blank=True)
    cleaned_at = models.DateTimeField(null=True, blank=True)
    confinement = models.CharField(max_length=200, blank=True)
    # A serving member's (S1): its probe passes, its restarts, the probe's error.
    ready = models.BooleanField(default=False)
    restarts = models.PositiveIntegerField(default=0)
    detail = models.CharField(max_length=200, blank=True)
    # H4: when its node last saw the member mark a checkpoint (only ever later).
    checkpointed_at = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} on {self.node_id}"


class StrayCommand(models.Model):
    """A command a node reports that the console never gave it: flagged, never killed (L5)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="stray_commands")
    command_id = models.CharField(max_length=64)
    state = models.CharField(max_length=16)
    exit_code = models.IntegerField(null=True, blank=True)
    first_reported_at = models.DateTimeField()
    last_reported_at = models.DateTimeField()

    class Meta:
        ordering = ["-last_reported_at"]
        constraints = [
            models.UniqueConstraint(fields=["node", "command_id"], name="one_stray_per_id"),
        ]

    def __str__(self) -> str:
        return f"unknown command {self.command_id} on {self.node_id}"


class ClusterSnapshot(models.Model):
    """What a cluster Fleet's manager last said its machines were (DESIGN.md §6).

    Read on a schedule. A failed read keeps the last good machines with their observation
    time, so they age out of placement by the freshness rule (L1) while the page shows why.
    """

    fleet = models.OneToOneField(
        Fleet, on_delete=models.CASCADE, primary_key=True, related_name="cluster_snapshot"
    )
    machines = models.JSONField(default=list, blank=True)  # Machine.as_dict() each
    observed_at = models.DateTimeField(null=True, blank=True)  # the last successful read
    attempted_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)  # the last read's failure; empty once one succeeds
    error_since = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"snapshot of {self.fleet_id}"

    @property
    def reachable(self) -> bool:
        return self.attempted_at is not None and not self.error


class LogFetch(models.Model):
    """A request for a member's output (its tail, or from an offset on), in transit: the web
    writes it, the gateway holding the node's stream asks the agent and writes the answer,
    the web reads it and deletes the row. Logs stay on their node; nothing here outlives a
    fetch."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    member = models.CharField(max_length=64)  # the member's start command id
    tail_bytes = models.PositiveIntegerField()  # the most bytes asked for
    # Asked: read from this byte of the member's output on; null: its tail.
    offset = models.PositiveBigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(db_index=True)
    answered_at = models.DateTimeField(null=True, blank=True)
    found = models.BooleanField(default=False)
    data = models.BinaryField(default=b"")
    # Answered: where data starts and ends in the output (null from an agent older than
    # offsets), and whether what was asked reached before the oldest byte the node keeps.
    data_offset = models.PositiveBigIntegerField(null=True, blank=True)
    next_offset = models.PositiveBigIntegerField(null=True, blank=True)
    truncated = models.BooleanField(default=False)


class CardFault(models.Model):
    """H6, H7: a fault judged on a node's card by its telemetry — quarantined automatically,
    or, the Fleet's health breaker tripped, recorded and shown only. The breaker counts a
    Fleet's quarantined rows within its window."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="card_faults")
    fleet = models.ForeignKey(Fleet, on_delete=models.CASCADE, related_name="+")
    uuid = models.CharField(max_length=200)
    index = models.PositiveSmallIntegerField()
    reason = models.CharField(max_length=200)
    at = models.DateTimeField()
    quarantined = models.BooleanField()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["fleet", "at"], name="card_fault_fleet_at")]

    def __str__(self) -> str:
        return f"card {self.index} of {self.node_id}: {self.reason}"


class HealthBreaker(models.Model):
    """H7: a Fleet's circuit breaker on automatic quarantine: tripped when one more would pass
    TUNEPLANE_HEALTH_BREAKER_SHARE of its cards within TUNEPLANE_HEALTH_BREAKER_WINDOW, reset
    by an operator only. The row is the lock a quarantine takes on its Fleet."""

    fleet = models.OneToOneField(
        Fleet, on_delete=models.CASCADE, primary_key=True, related_name="health_breaker"
    )
    tripped_at = models.DateTimeField(null=True, blank=True)
    tripped_reason = models.CharField(max_length=200, blank=True)
    reset_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"health breaker of {self.fleet_id}"

    @property
    def tripped(self) -> bool:
        return self.tripped_at is not None
