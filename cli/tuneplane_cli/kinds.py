"""What the commands may name as KIND: each with its API paths, how it is cancelled, how its
logs are asked for, and the columns of its table. A KIND is named singular or plural
(``training-job`` or ``training-jobs``).

An episode is named ``ENVIRONMENT/NUMBER`` (``7/2``): episodes are numbered per environment."""

from dataclasses import dataclass, field
from datetime import UTC, datetime

import click


def age(stamp: str | None, now: datetime | None = None) -> str:
    if not stamp:
        return ""
    seconds = int(((now or datetime.now(UTC)) - datetime.fromisoformat(stamp)).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def waiting(record: dict) -> str:
    """Why it waits (Q8), for work that waits: ``reason: message (#1 in project, #2 in
    Fleet)``, its place in its project's queue and in its Fleet's."""
    wait = record.get("waiting")
    if isinstance(wait, dict) and wait.get("reason"):
        return f"{wait['reason']}: {wait.get('message', '')}".strip() + _position(wait)
    if isinstance(wait, dict):  # a deployment's revision: by replica rank
        return "; ".join(
            f"replica {rank} {w['reason']}: {w['message']}{_position(w)}"
            for rank, w in wait.items()
        )
    return ""


def _position(wait: dict) -> str:
    in_project, in_fleet = wait.get("position_in_project"), wait.get("position_in_fleet")
    if not in_project or not in_fleet:
        return ""
    return f" (#{in_project} in project, #{in_fleet} in Fleet)"


def _latest(listed: list | None) -> dict:
    return max(listed or [], key=lambda r: r.get("number", 0), default={})


def runs_on(record: dict) -> str:
    """Where its processes run: the nodes of its latest attempt, revision or process."""
    members = record.get("members")
    if members is None and "attempts" in record:
        members = _latest(record["attempts"]).get("members")
    if members is None and "revisions" in record:
        members = _latest(record["revisions"]).get("members")
    if members is None:
        return record.get("node") or ""
    return ",".join(dict.fromkeys(m["node"] for m in members if m.get("node")))


def _deployment_waiting(record: dict) -> str:
    return waiting(_latest(record.get("revisions")))


def _get(key):
    def read(record):
        value = record.get(key)
        if value is None:
            return ""
        if isinstance(value, list):
            return ",".join(map(str, value))
        if isinstance(value, dict):
            return str(value.get("state", ""))
        return str(value)

    return read


def _age(record):
    return age(record.get("created_at"))


def _episode_id(record):
    return f"{record['environment']}/{record['number']}"


WORKLOAD = [
    ("ID", _get("id")),
    ("NAME", _get("name")),
    ("PROJECT", _get("project")),
    ("STATE", _get("state")),
    ("FLEET", _get("fleet")),
    ("CARDS", _get("cards")),
    ("NODES", runs_on),
    ("AGE", _age),
    ("WAITING", waiting),
]


@dataclass(frozen=True)
class Kind:
    name: str  # singular, as apply's `kind:` names it
    plural: str
    path: str  # the list's; its records are under it by id
    columns: list = field(default_factory=lambda: WORKLOAD)
    detail: bool = True  # GET path/ID answers one record
    cancel: str | None = None  # "post" (path/ID/cancel), "stop" (PATCH), "delete"
    logs: str | None = None  # "job" (attempt, rank), "replica" (revision, replica), "episode"
    events: bool = False
    dry_run: bool = False
    applied: bool = False

    def one(self, record_id: str) -> str:
        if self.name == "episode":
            environment, number = episode_id(record_id)
            return f"/api/environments/{environment}/episodes/{number}"
        return f"{self.path}/{record_id}"


def episode_id(record_id: str) -> tuple[str, str]:
    environment, slash, number = str(record_id).partition("/")
    if not (slash and environment.isdigit() and number.isdigit()):
        raise click.UsageError(f"An episode is named ENVIRONMENT/NUMBER (7/2), not {record_id!r}.")
    return environment, number


KINDS = [
    Kind(
        "training-job",
        "training-jobs",
        "/api/training-jobs",
        cancel="post",
        logs="job",
        events=True,
        dry_run=True,
        applied=True,
    ),
    Kind(
        "lifecycle-job",
        "lifecycle-jobs",
        "/api/lifecycle-jobs",
        cancel="post",
        logs="job",
        events=True,
        dry_run=True,
        applied=True,
    ),
    Kind(
        "deployment",
        "deployments",
        "/api/deployments",
        columns=[
            *WORKLOAD[:4],
            ("STATUS", _get("status")),
            *WORKLOAD[4:8],
            ("ADDRESS", _get("addresses")),
            ("WAITING", _deployment_waiting),
        ],
        cancel="stop",
        logs="replica",
        events=True,
        dry_run=True,
        applied=True,
    ),
    Kind(
        "playground-session",
        "playground-sessions",
        "/api/playground-sessions",
        columns=[
            *WORKLOAD[:8],
            ("ADDRESS", _get("address")),
            ("ENDS", lambda r: r.get("ends_at") or ""),
            WORKLOAD[8],
        ],
        cancel="delete",
        events=True,
        dry_run=True,
        applied=True,
    ),
    Kind(
        "environment",
        "environments",
        "/api/environments",
        columns=[WORKLOAD[i] for i in (0, 1, 2, 4, 5, 7)],
        detail=False,
        dry_run=True,
        applied=True,
    ),
    Kind(
        "episode",
        "episodes",
        "/api/environments/{environment}/episodes",
        columns=[
            ("ID", _episode_id),
            ("STATE", _get("state")),
            ("EXIT", _get("exit_code")),
            ("CARDS", _get("cards")),
            ("NODE", _get("node")),
            ("AGE", _age),
            ("WAITING", waiting),
        ],
        cancel="post",
        logs="episode",
        events=True,
        applied=True,
    ),
    Kind(
        "fleet",
        "fleets",
        "/api/fleets",
        columns=[
            ("ID", _get("id")),
            ("KIND", _get("kind")),
            ("DELIVERY", _get("delivery")),
            ("CAPABILITIES", _get("capabilities")),
            ("VISIBILITY", _get("visibility")),
            ("PROJECT", _get("project")),
            ("STATE", _get("state")),
            ("AGE", _age),
        ],
        applied=True,  # an administrator's: `kind: fleet` makes one
    ),
    Kind(
        "node",
        "nodes",
        "/api/nodes",
        columns=[
            ("ID", _get("id")),
            ("FLEET", _get("fleet")),
            ("HOSTNAME", _get("hostname")),
            ("CONNECTION", _get("connection")),
            ("SCHEDULING", _get("scheduling")),
            ("AGE", _age),
        ],
    ),
    Kind(
        "volume",
        "volumes",
        "/api/volumes",
        columns=[
            ("ID", _get("id")),
            ("NAME", _get("name")),
            ("PROJECT", _get("project")),
            ("URI", _get("uri")),
            ("AGE", _age),
        ],
        detail=False,
    ),
    Kind(
        "dataset",
        "datasets",
        "/api/datasets",
        columns=[
            ("ID", _get("id")),
            ("NAME", _get("name")),
            ("PROJECT", _get("project")),
            ("URI", _get("uri")),
            ("AGE", _age),
        ],
        detail=False,
    ),
]
_BY_NAME = {name: kind for kind in KINDS for name in (kind.name, kind.plural)}


def kind_named(name: str, *, has: str | None = None) -> Kind:
    """The kind ``name`` means; with ``has``, one that supports it (``cancel``, ``logs`` ...)."""
    kind = _BY_NAME.get(name.lower())
    if kind is None:
        raise click.BadParameter(
            f"{name!r} is no kind; one of: {', '.join(k.plural for k in KINDS)}.", param_hint="KIND"
        )
    if has is not None and not getattr(kind, has):
        able = [k.plural for k in KINDS if getattr(k, has)]
        raise click.BadParameter(
            f"{kind.plural} have no {has.replace('_', ' ')}; these do: {', '.join(able)}.",
            param_hint="KIND",
        )
    return kind
