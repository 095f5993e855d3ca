"""What a job on a node Fleet runs, checked before anything is written (DESIGN §7).

Each refusal names its field. The env a member gets from the agent (its cards, its labels,
its delivery, a gang's rendezvous) cannot be set by the job: those names are refused rather
than silently overridden.
"""

import re

from django.conf import settings

from tuneplane.errors import ValidationFailed

MAX_ARGV = 64
MAX_ARG_CHARS = 4096
MAX_SCRIPT_CHARS = 100_000
MAX_ENV = 128
MAX_ENV_VALUE = 4096
MAX_CPUS = 1024
MIN_MEMORY = 1 << 20
MAX_ATTEMPTS = 10
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# What the agent sets on every member (R4, H3: TUNEPLANE_ATTEMPT, TUNEPLANE_RESTART_COUNT,
# TUNEPLANE_CHECKPOINT_DIR among the TUNEPLANE_ names): a job cannot set or override them.
RESERVED_ENV = re.compile(
    r"(TUNEPLANE_.*|CUDA_VISIBLE_DEVICES|CUDA_DEVICE_ORDER|NVIDIA_VISIBLE_DEVICES|MASTER_ADDR"
    r"|MASTER_PORT|WORLD_SIZE|RANK|NODE_RANK|LOCAL_WORLD_SIZE)"
)


def _refuse(field: str, message: str):
    raise ValidationFailed(f"{field}: {message}", field=field)


MAX_GANG_DEADLINE = 86_400
# An image reference as docker and podman read it: [registry[:port]/]path[:tag][@digest].
MAX_IMAGE = 255
IMAGE = re.compile(
    r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[a-z0-9]+:[a-f0-9]{32,})?"
)


def checked_image(image) -> str:
    """``image``: "" (the member is a process) or a reference the node's container runtime
    pulls or has (DESIGN §7: a container when the job names one and the node has a runtime)."""
    if image is None or image == "":
        return ""
    if not isinstance(image, str) or len(image) > MAX_IMAGE or not IMAGE.fullmatch(image):
        _refuse(
            "image",
            f"an image reference of at most {MAX_IMAGE} characters "
            "([registry/]name[:tag][@digest], lowercase name), or empty.",
        )
    return image


FIELDS = (
    "command",
    "script",
    "image",
    "env",
    "cpus",
    "memory_bytes",
    "max_attempts",
    "gang_deadline_seconds",
    "priority",
    "preemptible",
    "preemption_grace_seconds",
    "retry",
)
# A job's own fields, which a deployment's revision, a session and an episode do not have.
JOB_ONLY = (
    "max_attempts",
    "gang_deadline_seconds",
    "priority",
    "preemptible",
    "preemption_grace_seconds",
)
MAX_PRIORITY = 1_000_000


def checked_run(**fields) -> dict:
    """The run fields of a job, normalised; a ValidationFailed naming the field otherwise."""
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        _refuse(unknown[0], "not a field of a job.")
    retry = fields.pop("retry", None)
    codes, most = checked_retry(retry, fields.get("max_attempts"))
    if most is not None:
        fields["max_attempts"] = most
    return {**_checked(**fields), "retry_on_exit_codes": codes}


MAX_RETRY_CODES = 32
RETRY_FIELDS = ("on_exit_codes", "max_attempts")


def checked_retry(retry, max_attempts=None) -> tuple[list[int], int | None]:
    """H3: ``retry: {on_exit_codes: [...], max_attempts: N}`` — the exit codes that retry
    the job (each attempt counted against max_attempts), and max_attempts said here rather
    than beside it. Returns the codes, sorted, and the max_attempts it names (None: none)."""
    if retry is None:
        return [], None
    if not isinstance(retry, dict):
        _refuse("retry", "an object: {on_exit_codes: [whole numbers], max_attempts: N}.")
    unknown = sorted(str(key) for key in retry if key not in RETRY_FIELDS)
    if unknown:
        _refuse(f"retry.{unknown[0][:64]}", "not a field of retry (on_exit_codes, max_attempts).")
    codes = retry.get("on_exit_codes", [])
    if (
        not isinstance(codes, list)
        or len(codes) > MAX_RETRY_CODES
        or not all(isinstance(c, int) and not isinstance(c, bool) and 1 <= c <= 255 for c in codes)
    ):
        _refuse(
            "retry.on_exit_codes",
            f"a list of at most {MAX_RETRY_CODES} exit codes, each a whole number from 1 to "
            "255 (0 is success; a member ended by signal N exits 128 + N).",
        )
    most = retry.get("max_attempts")
    if most is not None:
        if isinstance(most, bool) or not isinstance(most, int) or not 1 <= most <= MAX_ATTEMPTS:
            _refuse("retry.max_attempts", f"a whole number from 1 to {MAX_ATTEMPTS}.")
        if max_attempts is not None and max_attempts != most:
            _refuse(
                "retry.max_attempts",
                f"{most}, but max_attempts says {max_attempts}: give it once (either place).",
            )
    return sorted(set(codes)), most


def _checked(
    *,
    command=None,
    script="",
    image="",
    env=None,
    cpus=None,
    memory_bytes=None,
    max_attempts=None,
    gang_deadline_seconds=None,
    priority=0,
    preemptible=False,
    preemption_grace_seconds=None,
) -> dict:
    command = [] if command is None else command
    if not isinstance(command, list) or len(command) > MAX_ARGV:
        _refuse("command", f"a list of at most {MAX_ARGV} strings (argv).")
    if command and (
        not all(isinstance(arg, str) and len(arg) <= MAX_ARG_CHARS for arg in command)
        or not command[0]
    ):
        _refuse("command", f"strings of at most {MAX_ARG_CHARS} characters, the first the program.")
    if not isinstance(script, str) or len(script) > MAX_SCRIPT_CHARS:
        _refuse("script", f"a string of at most {MAX_SCRIPT_CHARS} characters.")
    if command and script:
        _refuse("script", "give command or script, not both.")
    env = {} if env is None else env
    if not isinstance(env, dict) or len(env) > MAX_ENV:
        _refuse("env", f"an object of at most {MAX_ENV} names to strings.")
    for name, value in env.items():
        if not ENV_NAME.fullmatch(name):
            _refuse(f"env.{name[:64]}", "not a variable name ([A-Za-z_][A-Za-z0-9_]*).")
        if RESERVED_ENV.fullmatch(name):
            _refuse(f"env.{name}", "set by the agent for every member (rule R4); not settable.")
        if not isinstance(value, str) or len(value) > MAX_ENV_VALUE or "\0" in value:
            _refuse(f"env.{name}", f"a string of at most {MAX_ENV_VALUE} characters.")
    if cpus is not None and (
        isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or not 0 < cpus <= MAX_CPUS
    ):
        _refuse("cpus", f"a number above 0 and at most {MAX_CPUS}.")
    if memory_bytes is not None and (
        isinstance(memory_bytes, bool)
        or not isinstance(memory_bytes, int)
        or memory_bytes < MIN_MEMORY
        or memory_bytes > 1 << 50
    ):
        _refuse("memory_bytes", f"a whole number of bytes, at least {MIN_MEMORY}.")
    max_attempts = 3 if max_attempts is None else max_attempts
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
        _refuse("max_attempts", f"a whole number from 1 to {MAX_ATTEMPTS}.")
    if not 1 <= max_attempts <= MAX_ATTEMPTS:
        _refuse("max_attempts", f"a whole number from 1 to {MAX_ATTEMPTS}.")
    if gang_deadline_seconds is not None and (
        isinstance(gang_deadline_seconds, bool)
        or not isinstance(gang_deadline_seconds, int)
        or not 1 <= gang_deadline_seconds <= MAX_GANG_DEADLINE
    ):
        _refuse("gang_deadline_seconds", f"whole seconds from 1 to {MAX_GANG_DEADLINE}.")
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not -MAX_PRIORITY <= priority <= MAX_PRIORITY
    ):
        _refuse("priority", "a whole number; higher is placed first within its project (Q3).")
    if not isinstance(preemptible, bool):
        _refuse("preemptible", "true or false (Q4).")
    most = settings.TUNEPLANE_PREEMPT_GRACE
    if preemption_grace_seconds is not None and (
        isinstance(preemption_grace_seconds, bool)
        or not isinstance(preemption_grace_seconds, int)
        or not 0 <= preemption_grace_seconds <= most
    ):
        _refuse(
            "preemption_grace_seconds",
            f"whole seconds from 0 to {most} (TUNEPLANE_PREEMPT_GRACE): the time between "
            "SIGTERM and SIGKILL when it is preempted may be shorter than the Fleet's, never "
            "longer (rule Q6).",
        )
    return {
        "priority": priority,
        "preemptible": preemptible,
        "preemption_grace_seconds": preemption_grace_seconds,
        "gang_deadline_seconds": gang_deadline_seconds,
        "command": command,
        "script": script,
        "image": checked_image(image),
        "env": env,
        "cpus": float(cpus) if cpus is not None else None,
        "memory_bytes": memory_bytes,
        "max_attempts": max_attempts,
    }


def require_runnable(run: dict) -> None:
    """On a node Fleet the agents run the job: it must say what to run (an image's own
    default command will do)."""
    if not run["command"] and not run["script"] and not run.get("image"):
        _refuse(
            "command",
            "a job on a node Fleet runs a command (argv), a script or an image's default "
            "command; give one of them.",
        )


MAX_REPLICAS = 64
READINESS_PATH = re.compile(r"/[!-~]{0,199}")
SERVE_FIELDS = (
    "command",
    "script",
    "image",
    "env",
    "cpus",
    "memory_bytes",
    "port",
    "readiness_path",
    "replicas",
)


def checked_serve(*, port=None, readiness_path="/health", replicas=1, **fields) -> dict:
    """What a deployment's revision serves (S1), normalised; a ValidationFailed naming the
    field otherwise. ``port`` is where the process listens (the agent passes it as PORT)
    and where the agent's readiness probe asks ``readiness_path``."""
    unknown = sorted(set(fields) - set(SERVE_FIELDS))
    if unknown:
        _refuse(unknown[0], "not a field of a deployment.")
    run = _checked(**fields)
    for name in JOB_ONLY:
        del run[name]
    if "PORT" in run["env"]:
        _refuse("env.PORT", "set by the agent to the deployment's port (rule S1); not settable.")
    if port is not None and (
        isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535
    ):
        _refuse("port", "a whole number from 1 to 65535: the port the process listens on.")
    if not isinstance(readiness_path, str) or not READINESS_PATH.fullmatch(readiness_path):
        _refuse(
            "readiness_path",
            "a path starting with /, at most 200 printable characters, no spaces.",
        )
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        _refuse("replicas", f"a whole number from 1 to {MAX_REPLICAS}.")
    if not 1 <= replicas <= MAX_REPLICAS:
        _refuse("replicas", f"a whole number from 1 to {MAX_REPLICAS}.")
    return {**run, "port": port, "readiness_path": readiness_path, "replicas": replicas}


def require_servable(serve: dict) -> None:
    """On a node Fleet the agents run the replicas: each needs what to run and its port."""
    if not serve["command"] and not serve["script"] and not serve.get("image"):
        _refuse(
            "command",
            "a deployment on a node Fleet serves a command (argv), a script or an image's "
            "default command; give one.",
        )
    if serve["port"] is None:
        _refuse("port", "a deployment on a node Fleet names the port its process listens on.")


def checked_session(*, ttl_seconds=None, max_ttl: int, **fields) -> dict:
    """A playground session on a node Fleet (S4): what it serves, as a replica, and its
    lifetime, at most ``max_ttl`` (TUNEPLANE_PLAYGROUND_MAX_TTL)."""
    if "replicas" in fields:
        _refuse("replicas", "a playground session is one served process.")
    serve = checked_serve(**fields)
    del serve["replicas"]
    ttl = 3600 if ttl_seconds is None else ttl_seconds
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= max_ttl:
        _refuse("ttl_seconds", f"whole seconds from 1 to {max_ttl} (the session's lifetime).")
    return {**serve, "ttl_seconds": ttl}


EPISODE_FIELDS = (
    "command",
    "script",
    "image",
    "env",
    "cpus",
    "memory_bytes",
    "cards",
    "timeout_seconds",
)


def checked_episode(*, manifest: dict, max_timeout: int, **fields) -> dict:
    """An episode (S5): its command or script (else the environment manifest's), env, cards,
    cpus, memory and its own timeout, at most ``max_timeout``."""
    unknown = sorted(set(fields) - set(EPISODE_FIELDS))
    if unknown:
        _refuse(unknown[0], "not a field of an episode.")
    cards = fields.pop("cards", 0)
    timeout = fields.pop("timeout_seconds", None)
    if not fields.get("command") and not fields.get("script") and not fields.get("image"):
        default = manifest.get("command") if isinstance(manifest, dict) else None
        if isinstance(default, list) and default:
            fields["command"] = default
        elif isinstance(default, str) and default:
            fields["script"] = default
    run = _checked(**fields)
    for name in JOB_ONLY:
        del run[name]
    require_runnable(run)
    if isinstance(cards, bool) or not isinstance(cards, int) or not 0 <= cards <= 64:
        _refuse("cards", "a whole number of cards from 0 to 64.")
    timeout = 600 if timeout is None else timeout
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 1 <= timeout <= max_timeout:
        _refuse("timeout_seconds", f"whole seconds from 1 to {max_timeout} (rule S5).")
    return {**run, "cards": cards, "timeout_seconds": timeout}
