"""What the workload endpoints accept: shapes only. The run and serve fields are checked by
placement.runspec (the one place that knows them), so the API, the admin and a script refuse
the same input with the same words."""

from rest_framework import serializers

from nodes.agent.wire import LOG_TAIL_MAX
from tuneplane.api.fields import StrictCharField, StrictChoiceField, StrictSerializer
from tuneplane.api.query import query_integer

from ..choices import DeploymentState, LifecycleKind

MAX_CARDS = 1024
MAX_NODES = 256
IMAGE_HELP = (
    "On a node Fleet: a container image each member runs in (command or script inside it; "
    "with neither, the image's default), only on nodes with a container runtime."
)


def _name():
    return StrictCharField(max_length=200)


def _names(help_text: str = ""):
    return serializers.ListField(
        child=StrictCharField(max_length=63),
        required=False,
        default=list,
        max_length=64,
        help_text=help_text,
    )


class RetryRequest(StrictSerializer):
    on_exit_codes = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=255),
        max_length=32,
        required=False,
        help_text="Exit codes (1-255; 128 + N for a signal N) that mean try again.",
    )
    max_attempts = serializers.IntegerField(
        min_value=1,
        max_value=10,
        required=False,
        help_text="max_attempts said here instead of beside retry (the same number if both).",
    )

    class Meta:
        ref_name = "RetryRequest"


class CardsRequest(StrictSerializer):
    project = StrictCharField(
        max_length=50, help_text="The project's slug: its quotas and the Fleets it sees (F8)."
    )
    name = _name()
    series = StrictCharField(
        max_length=63,
        required=False,
        allow_blank=True,
        default="",
        help_text='A hardware series (`h100`…) its cards must be of (J4); "" any card.',
    )
    cards = serializers.IntegerField(
        min_value=1,
        max_value=MAX_CARDS,
        required=False,
        default=1,
        help_text="Cards for each member, all on its one node (R1, R4).",
    )


class JobRequest(CardsRequest):
    """The run fields are checked by placement.runspec (the one place that knows them), so
    the API, the admin and a script refuse the same input with the same words."""

    nodes = serializers.IntegerField(
        min_value=1,
        max_value=MAX_NODES,
        required=False,
        default=1,
        help_text="Members, one per node: more than 1 is a gang, started all or none (R3).",
    )
    volumes = _names("The project's volumes it reads and writes, by name.")
    datasets = _names("The project's datasets it reads, by name.")
    command = serializers.ListField(
        child=StrictCharField(max_length=4096, allow_blank=True),
        max_length=64,
        required=False,
        default=list,
        help_text="On a node Fleet: the argv to run, or give `script`.",
    )
    script = StrictCharField(
        max_length=100_000,
        required=False,
        allow_blank=True,
        default="",
        help_text="Run by /bin/bash on a node Fleet; what a cluster Fleet's manager runs "
        "(a batch script for Slurm, an entrypoint for a RayJob).",
    )
    image = StrictCharField(
        max_length=255,
        required=False,
        allow_blank=True,
        default="",
        help_text=IMAGE_HELP,
    )
    env = serializers.DictField(
        child=StrictCharField(max_length=4096, allow_blank=True),
        required=False,
        default=dict,
        help_text="Names to string values, for every member (not shown again).",
    )
    cpus = serializers.FloatField(
        min_value=0.001,
        max_value=1024,
        required=False,
        default=None,
        allow_null=True,
        help_text="CPUs each member is confined to (R5).",
    )
    memory_bytes = serializers.IntegerField(
        min_value=1 << 20,
        max_value=1 << 50,
        required=False,
        default=None,
        allow_null=True,
        help_text="Memory each member is confined to (R5); over it the member ends oom.",
    )
    max_attempts = serializers.IntegerField(
        min_value=1,
        max_value=10,
        required=False,
        default=None,
        allow_null=True,
        help_text="The attempts its own (user) ends may spend, retries included (R9, H2; 3 "
        "when not given); an end by the machine's fault never spends one.",
    )
    retry = RetryRequest(
        required=False,
        default=None,
        allow_null=True,
        help_text="H3: which exit codes retry it (each retry spends one of max_attempts); "
        "any other non-zero exit fails it at once.",
    )
    gang_deadline_seconds = serializers.IntegerField(
        min_value=1,
        max_value=86_400,
        required=False,
        default=None,
        allow_null=True,
        help_text="A gang's members must all run within this of allocation (R3); "
        "TUNEPLANE_GANG_DEADLINE when not given.",
    )

    priority = serializers.IntegerField(
        min_value=-1_000_000,
        max_value=1_000_000,
        required=False,
        default=0,
        help_text="Within its project, higher is placed first (Q3); at most the project's "
        "max_priority, which an administrator sets.",
    )
    preemptible = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Whether it may be preempted while within its project's guarantee (Q4); "
        "work on borrowed cards always may.",
    )
    preemption_grace_seconds = serializers.IntegerField(
        min_value=0,
        required=False,
        default=None,
        allow_null=True,
        help_text="Seconds between SIGTERM and SIGKILL when it is preempted (Q6), if less "
        "than TUNEPLANE_PREEMPT_GRACE (120 s by default), which is also the most.",
    )

    class Meta:
        ref_name = "JobRequest"


class TrainingJobRequest(JobRequest):
    class Meta:
        ref_name = "TrainingJobRequest"


class LifecycleJobRequest(JobRequest):
    kind = StrictChoiceField(choices=LifecycleKind.values)

    class Meta:
        ref_name = "LifecycleJobRequest"


def _serve_fields(defaults: bool) -> dict:
    """What a revision serves on a node Fleet (S1). Checked by placement.runspec: these only
    say the shapes. Without defaults (a new revision), what is not given is inherited."""

    def given(default):
        return {"default": default} if defaults else {}

    return {
        "command": serializers.ListField(
            child=StrictCharField(max_length=4096, allow_blank=True),
            max_length=64,
            required=False,
            help_text="The argv each replica runs; or give `script`.",
            **given(list),
        ),
        "script": StrictCharField(
            max_length=100_000,
            required=False,
            allow_blank=True,
            help_text="Run by /bin/bash.",
            **given(""),
        ),
        "image": StrictCharField(
            max_length=255, required=False, allow_blank=True, help_text=IMAGE_HELP, **given("")
        ),
        "env": serializers.DictField(
            child=StrictCharField(max_length=4096, allow_blank=True),
            required=False,
            help_text="Names to string values (not shown again). PORT is the agent's.",
            **given(dict),
        ),
        "port": serializers.IntegerField(
            min_value=1,
            max_value=65535,
            required=False,
            allow_null=True,
            help_text="The port the process listens on; the agent passes it as PORT and probes it.",
            **given(None),
        ),
        "readiness_path": StrictCharField(
            max_length=200,
            required=False,
            help_text="HTTP GET 127.0.0.1:port+path every 5 s, 2 s timeout; 3 failures: "
            "not Ready (S1).",
            **given("/health"),
        ),
        "replicas": serializers.IntegerField(min_value=1, max_value=64, required=False, **given(1)),
        "cpus": serializers.FloatField(
            min_value=0.001, max_value=1024, required=False, allow_null=True, **given(None)
        ),
        "memory_bytes": serializers.IntegerField(
            min_value=1 << 20, max_value=1 << 50, required=False, allow_null=True, **given(None)
        ),
    }


def _request(name: str, base, **fields):
    meta = type("Meta", (), {"ref_name": name})
    return type(name, (base,), {"__module__": __name__, "Meta": meta, **fields})


DeploymentRequest = _request(
    "DeploymentRequest",
    CardsRequest,
    fleet=StrictCharField(max_length=63, required=False, allow_null=True, default=None),
    **_serve_fields(defaults=True),
)
# A new revision (S2): what it does not say is as the current revision has it.
RevisionRequest = _request("RevisionRequest", StrictSerializer, **_serve_fields(defaults=False))


class DeploymentUpdateRequest(StrictSerializer):
    state = StrictChoiceField(choices=DeploymentState.values, required=False)
    fleet = StrictCharField(max_length=63, required=False)

    class Meta:
        ref_name = "DeploymentUpdateRequest"


_session_fields = {k: v for k, v in _serve_fields(defaults=True).items() if k != "replicas"}
PlaygroundRequest = _request(
    "PlaygroundRequest",
    CardsRequest,
    ttl_seconds=serializers.IntegerField(
        min_value=1,
        required=False,
        default=None,
        allow_null=True,
        help_text="On a node Fleet: the session's lifetime (default 3600 s, at most "
        "TUNEPLANE_PLAYGROUND_MAX_TTL); then it is stopped and cleaned (S4).",
    ),
    **_session_fields,
)


class EpisodeRequest(StrictSerializer):
    """S5: what the episode runs (else the manifest's command), with its own timeout."""

    command = serializers.ListField(
        child=StrictCharField(max_length=4096, allow_blank=True),
        max_length=64,
        required=False,
        default=list,
    )
    script = StrictCharField(max_length=100_000, required=False, allow_blank=True, default="")
    image = StrictCharField(
        max_length=255, required=False, allow_blank=True, default="", help_text=IMAGE_HELP
    )
    env = serializers.DictField(
        child=StrictCharField(max_length=4096, allow_blank=True), required=False, default=dict
    )
    cards = serializers.IntegerField(min_value=0, max_value=64, required=False, default=0)
    cpus = serializers.FloatField(
        min_value=0.001, max_value=1024, required=False, default=None, allow_null=True
    )
    memory_bytes = serializers.IntegerField(
        min_value=1 << 20, max_value=1 << 50, required=False, default=None, allow_null=True
    )
    timeout_seconds = serializers.IntegerField(
        min_value=1,
        required=False,
        default=None,
        allow_null=True,
        help_text="Default 600; at most TUNEPLANE_EPISODE_MAX_TIMEOUT. At it the episode "
        "is stopped and ends timed_out (S5).",
    )

    class Meta:
        ref_name = "EpisodeRequest"


# A log's query parameters are bounded, each (R23): query_integer.
def _tail_bytes():
    return query_integer(
        min_value=1,
        max_value=LOG_TAIL_MAX,
        required=False,
        default=65536,
        help_text="The most bytes answered: the last ones, or from `offset` on.",
    )


def _offset():
    return query_integer(
        min_value=0,
        required=False,
        default=None,
        help_text="Read what was written from this byte of the output on (an answer's "
        "`next_offset`: how a log is followed); the tail when not given.",
    )


class TailQuery(StrictSerializer):
    tail_bytes = _tail_bytes()
    offset = _offset()

    class Meta:
        ref_name = "TailQuery"


class EnvironmentRequest(StrictSerializer):
    project = StrictCharField(max_length=50)
    name = _name()
    manifest = serializers.JSONField()

    class Meta:
        ref_name = "EnvironmentRequest"


class StorageRequest(StrictSerializer):
    project = StrictCharField(max_length=50)
    name = serializers.SlugField(max_length=63)
    uri = StrictCharField(max_length=500, required=False, allow_blank=True, default="")

    class Meta:
        ref_name = "StorageRequest"


class LogsQuery(StrictSerializer):
    attempt = query_integer(
        min_value=1, required=False, default=None, help_text="The latest when not given."
    )
    rank = query_integer(min_value=0, required=False, default=0)
    tail_bytes = _tail_bytes()
    offset = _offset()

    class Meta:
        ref_name = "LogsQuery"


class ReplicaLogsQuery(StrictSerializer):
    revision = query_integer(
        min_value=1, required=False, default=None, help_text="The newest when not given."
    )
    replica = query_integer(min_value=0, required=False, default=0)
    tail_bytes = _tail_bytes()
    offset = _offset()

    class Meta:
        ref_name = "ReplicaLogsQuery"


class QuotaRequest(StrictSerializer):
    """One project's quota on the Fleet, for one hardware series or any card (Q1)."""

    project = StrictCharField(max_length=63)
    series = StrictCharField(
        max_length=63, required=False, allow_blank=True, default="", help_text='"" any card.'
    )
    guaranteed = serializers.IntegerField(min_value=0, max_value=1 << 20, required=False, default=0)
    limit = serializers.IntegerField(
        min_value=0,
        max_value=1 << 20,
        required=False,
        default=None,
        allow_null=True,
        help_text="The most cards it may hold; null for unlimited. At least `guaranteed`.",
    )
    weight = serializers.IntegerField(
        min_value=1, max_value=1000, required=False, default=1, help_text="Its fair share's weight."
    )

    class Meta:
        ref_name = "QuotaRequest"


class QuotasRequest(StrictSerializer):
    quotas = QuotaRequest(many=True)

    class Meta:
        ref_name = "QuotasRequest"
