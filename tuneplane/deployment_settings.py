"""The registry of deployment settings a Fleet's ``config`` may override.

One place lists every key, the Fleet kinds whose code reads it, and what its
value must look like. A key that no setting reads is not an error (F4): it is
accepted and reported, because a misspelled override is a setting an operator
believes is in effect and is not. A known key with a value of the wrong shape
is an error.
"""

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from .errors import ValidationFailed
from .secret_sources import env_name_refusal, file_path_refusal, resolved_path_refusal

MAX_VALUE_LENGTH = 2048
_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
# The slurmrestd API versions a slurm Fleet's backend speaks, newest first: Slurm 22.05's
# v0.0.38 and 23.11-24.11's v0.0.40-v0.0.42 (nodes/backends/slurm_api.py has one dialect each).
SLURM_API_VERSIONS = ("v0.0.42", "v0.0.41", "v0.0.40", "v0.0.38")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _string(value) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be a string, not {_json_type(value)}")
    if not value.strip():
        raise ValueError("must not be empty")
    if len(value) > MAX_VALUE_LENGTH:
        raise ValueError(f"must be at most {MAX_VALUE_LENGTH} characters")
    if any(ord(character) < 32 or ord(character) == 127 for character in value):
        raise ValueError("must not contain control characters")
    return value


def _http_url(value) -> str:
    value = _string(value)
    parts = urlsplit(value)
    if parts.scheme not in {"http", "https"} or not parts.netloc:
        raise ValueError("must be an http:// or https:// URL")
    return value


def _positive_number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError("must be a number above 0")
    return value


def _positive_whole(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError("must be a whole number above 0")
    return value


def _whole_up_to(most: int):
    def check(value) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
            raise ValueError(f"must be a whole number from 0 to {most}")
        return value

    return check


def _healthy_samples(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100:
        raise ValueError("must be a whole number from 1 to 100")
    return value


# H5: what a Fleet's health_check may say, and the bounds of its numbers (seconds).
HEALTH_CHECK_KEYS = ("command", "interval_seconds", "timeout_seconds")
HEALTH_CHECK_INTERVAL = (10, 86_400)
HEALTH_CHECK_TIMEOUT = (1, 3_600)


def _health_check(value) -> dict:
    if not isinstance(value, dict):
        raise ValueError(
            f"must be an object {{command, interval_seconds, timeout_seconds}}, "
            f"not {_json_type(value)}"
        )
    unknown = sorted(set(value) - set(HEALTH_CHECK_KEYS))
    if unknown:
        raise ValueError(f"has no key {unknown[0]!r}; its keys are {', '.join(HEALTH_CHECK_KEYS)}")
    command = value.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ValueError("command must be a shell command, a non-empty string")
    if len(command) > MAX_VALUE_LENGTH:
        raise ValueError(f"command must be at most {MAX_VALUE_LENGTH} characters")
    for key, (low, high) in (
        ("interval_seconds", HEALTH_CHECK_INTERVAL),
        ("timeout_seconds", HEALTH_CHECK_TIMEOUT),
    ):
        number = value.get(key)
        if number is not None and (
            isinstance(number, bool) or not isinstance(number, int) or not low <= number <= high
        ):
            raise ValueError(f"{key} must be a whole number from {low} to {high}")
    return value


def _absolute_path(value) -> str:
    value = _string(value)
    if not PurePosixPath(value).is_absolute():
        raise ValueError("must be an absolute path")
    return value


def _token_env(value) -> str:
    value = _matching(_ENV_NAME, "an environment variable name")(value)
    refusal = env_name_refusal(value)
    if refusal:
        raise ValueError(refusal)
    return value


def _token_file(value) -> str:
    """Where the path lies, and, if it exists now, where its symbolic links lead: a link out
    of the secrets directory is refused when the config is saved, not only at each read."""
    value = _string(value)
    refusal = file_path_refusal(value) or resolved_path_refusal(Path(value))
    if refusal:
        raise ValueError(refusal)
    return value


def _one_of(values: tuple[str, ...]):
    def check(value) -> str:
        value = _string(value)
        if value not in values:
            raise ValueError(f"must be one of {', '.join(values)}")
        return value

    return check


def _matching(pattern: re.Pattern, description: str):
    def check(value) -> str:
        value = _string(value)
        if not pattern.match(value):
            raise ValueError(f"must be {description}")
        return value

    return check


def _json_type(value) -> str:
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        list: "a list",
        dict: "an object",
        type(None): "null",
    }.get(type(value), "a string")


@dataclass(frozen=True)
class DeploymentSetting:
    key: str
    kinds: frozenset[str]
    check: Callable[[object], str]
    help: str


SETTINGS = {
    s.key: s
    for s in [
        DeploymentSetting(
            "storage_root",
            frozenset({"node"}),
            _absolute_path,
            "Shared storage root every node of the Fleet mounts.",
        ),
        DeploymentSetting(
            "image_pull",
            frozenset({"node"}),
            _one_of(("always", "missing")),
            "always: a member's image is pulled at every start, never run from a node's cache "
            "without the registry's say (R14); missing (the default): the runtime's cache.",
        ),
        DeploymentSetting(
            "member_cpus",
            frozenset({"node"}),
            _positive_number,
            "CPUs a member gets when its request names none (R16; else its cards' share).",
        ),
        DeploymentSetting(
            "member_memory_bytes",
            frozenset({"node"}),
            _positive_whole,
            "Memory a member gets when its request names none (R16; else its cards' share).",
        ),
        DeploymentSetting(
            "infra_retries",
            frozenset({"node"}),
            _whole_up_to(100),
            "H2: how many attempts of a job may end by the machine's fault (node lost, member "
            "vanished, a card's fault, a start the agent could not make) and be retried; they "
            "never spend its max_attempts (TUNEPLANE_INFRA_RETRIES, 10, when not set).",
        ),
        DeploymentSetting(
            "slurm_rest_url", frozenset({"slurm"}), _http_url, "slurmrestd base URL."
        ),
        DeploymentSetting(
            "slurm_api_version",
            frozenset({"slurm"}),
            _one_of(SLURM_API_VERSIONS),
            "slurmrestd API version; unset: the newest of these the cluster offers.",
        ),
        DeploymentSetting(
            "slurm_partition",
            frozenset({"slurm"}),
            _string,
            "Partition (or comma-separated partitions) that belong to the Fleet.",
        ),
        DeploymentSetting(
            "slurm_user", frozenset({"slurm"}), _string, "User name sent as X-SLURM-USER-NAME."
        ),
        DeploymentSetting(
            "slurm_token_env",
            frozenset({"slurm"}),
            _token_env,
            "Environment variable (TUNEPLANE_TOKEN_*) holding the slurmrestd JWT.",
        ),
        DeploymentSetting(
            "slurm_token_file",
            frozenset({"slurm"}),
            _token_file,
            "File in TUNEPLANE_SECRETS_DIR holding the slurmrestd JWT.",
        ),
        DeploymentSetting(
            "slurm_workdir",
            frozenset({"slurm"}),
            _absolute_path,
            "Working directory of submitted jobs on the Slurm nodes (/tmp).",
        ),
        DeploymentSetting(
            "kube_api_url", frozenset({"kubernetes"}), _http_url, "Kubernetes API server URL."
        ),
        DeploymentSetting(
            "kube_context",
            frozenset({"kubernetes"}),
            _string,
            "kubeconfig context to use instead of an API URL.",
        ),
        DeploymentSetting(
            "kube_token_env",
            frozenset({"kubernetes"}),
            _token_env,
            "Environment variable (TUNEPLANE_TOKEN_*) holding a bearer token for kube_api_url.",
        ),
        DeploymentSetting(
            "kube_token_file",
            frozenset({"kubernetes"}),
            _token_file,
            "File in TUNEPLANE_SECRETS_DIR holding a bearer token for kube_api_url "
            "(a service account's).",
        ),
        DeploymentSetting(
            "kuberay_namespace",
            frozenset({"kubernetes"}),
            _matching(_DNS_LABEL, "a Kubernetes namespace name"),
            "Namespace KubeRay clusters run in.",
        ),
        DeploymentSetting(
            "on_card_fault",
            frozenset({"node"}),
            _one_of(("stop", "continue")),
            "H6: a member on a card just quarantined is stopped (stop) or left running "
            "(continue); unset: stop for training, continue for serving.",
        ),
        DeploymentSetting(
            "health_returns_after",
            frozenset({"node"}),
            _healthy_samples,
            "H6: healthy samples in a row a quarantined card needs to return (2): telemetry "
            "samples, or passes of its health check where the Fleet has one (H5).",
        ),
        DeploymentSetting(
            "health_check",
            frozenset({"node"}),
            _health_check,
            "H5: {command, interval_seconds (300), timeout_seconds (60)}: a shell command each "
            "node runs, confined like a member, on each card alone — before the card first "
            "takes work, after every member that held it, and every interval while it is idle. "
            "A card takes work only once checked; a check that does not exit 0 (or ends past "
            "timeout_seconds) quarantines its card (H6) as the breaker admits (H7).",
        ),
    ]
}


@dataclass(frozen=True)
class ConfigWarning:
    code: str
    key: str
    message: str

    def as_dict(self) -> dict:
        return {"code": self.code, "key": self.key, "message": self.message}


def check_config(kind: str, config) -> dict:
    """Validate a Fleet config for ``kind``; return it unchanged or raise ValidationFailed."""
    if not isinstance(config, dict):
        raise ValidationFailed(
            f"config must be a JSON object, not {_json_type(config)}.", field="config"
        )
    for key, value in config.items():
        setting = SETTINGS.get(key)
        if setting is None or kind not in setting.kinds:
            continue
        try:
            setting.check(value)
        except ValueError as exc:
            raise ValidationFailed(f"config.{key} {exc}.", field=f"config.{key}") from None
    return config


def unread_keys(kind: str, config: dict) -> list[ConfigWarning]:
    """Keys of ``config`` that no setting of a ``kind`` Fleet reads (F4)."""
    warnings = []
    for key in sorted(config):
        setting = SETTINGS.get(key)
        if setting is None:
            close = difflib.get_close_matches(key, keys_for(kind), n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            message = (
                f"config key '{key}' is not read by any setting; it is saved but has "
                f"no effect.{hint} Known keys for {kind} Fleets: "
                f"{', '.join(keys_for(kind))}."
            )
        elif kind not in setting.kinds:
            message = (
                f"config key '{key}' is read only for {', '.join(sorted(setting.kinds))} "
                f"Fleets; on a {kind} Fleet it is saved but has no effect."
            )
        else:
            continue
        warnings.append(ConfigWarning("unknown_config_key", key, message))
    return warnings


def keys_for(kind: str) -> list[str]:
    return sorted(key for key, s in SETTINGS.items() if kind in s.kinds)
