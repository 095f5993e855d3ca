"""A ``slurm`` Fleet read through slurmrestd, and handed its jobs there (DESIGN.md §6).

Slurm is the allocator (P7): the console reads what the partitions hold and submits what it
admitted; it never places work on a Slurm node itself. The JWT comes from an environment
variable or a file named in the Fleet's config at each call: never the token itself in the
Fleet record, a log line or an error message.
"""

import re
from dataclasses import dataclass

import httpx

from ..choices import SchedulingState
from .base import BackendError, JobSpec, Machine, OutcomeUnknown
from .credentials import read_token

DEFAULT_API_VERSION = "v0.0.38"
TIMEOUT = httpx.Timeout(10.0, connect=3.0)
# "gpu:h100:4", "gpu:h100:4(S:0-1)", "gpu:2", several comma-separated; in gres_used the
# index list may hold commas too ("gpu:h100:2(IDX:0,2)"), hence a pattern, not a split.
_GRES = re.compile(r"(?:^|,)gpu(?::([A-Za-z0-9_.-]+))?:(\d+)")
_GONE_STATES = {"down", "unknown", "future"}
_GONE_FLAGS = {"NOT_RESPONDING", "POWERED_DOWN", "POWER_DOWN"}
_DRAIN_STATES = {"drained", "draining", "drain"}


def gres_cards(gres: str | None) -> dict[str, int]:
    """Card counts by Slurm's GPU type name ("gpu" when the type is not given)."""
    cards: dict[str, int] = {}
    for name, count in _GRES.findall(gres or ""):
        cards[name or "gpu"] = cards.get(name or "gpu", 0) + int(count)
    return cards


@dataclass(frozen=True)
class SlurmBackend:
    url: str
    api_version: str
    partitions: tuple[str, ...]
    user: str
    token_env: str = ""
    token_file: str = ""
    workdir: str = "/tmp"

    @classmethod
    def from_config(cls, config: dict) -> "SlurmBackend":
        missing = [key for key in ("slurm_rest_url", "slurm_user") if not config.get(key)]
        if not (config.get("slurm_token_env") or config.get("slurm_token_file")):
            missing.append("slurm_token_env or slurm_token_file")
        if missing:
            raise BackendError(f"config is missing {', '.join(missing)}")
        partitions = tuple(
            p.strip() for p in config.get("slurm_partition", "").split(",") if p.strip()
        )
        return cls(
            url=config["slurm_rest_url"].rstrip("/"),
            api_version=config.get("slurm_api_version") or DEFAULT_API_VERSION,
            partitions=partitions,
            user=config["slurm_user"],
            token_env=config.get("slurm_token_env", ""),
            token_file=config.get("slurm_token_file", ""),
            workdir=config.get("slurm_workdir") or "/tmp",
        )

    # -- the interface --------------------------------------------------------------------

    def read(self) -> list[Machine]:
        nodes = self._call("GET", "nodes")["nodes"] or []
        return [self._machine(node) for node in nodes if self._ours(node)]

    def submit(self, job: JobSpec) -> str:
        gres = f"gpu:{job.series}:{job.cards}" if job.series else f"gpu:{job.cards}"
        spec = {
            "name": job.name[:200],
            "nodes": job.nodes,
            "current_working_directory": self.workdir,
            "environment": {"PATH": "/bin:/usr/bin:/usr/local/bin"},
            "standard_output": f"{self.workdir}/tuneplane-%j.out",
        }
        if job.key:
            spec["comment"] = job.key  # what resume() finds it by
        if job.cards:
            spec["gres"] = gres
        if self.partitions:
            spec["partition"] = self.partitions[0]
        answer = self._call("POST", "job/submit", json={"script": job.script, "job": spec})
        return str(answer["job_id"])

    def resume(self, job: JobSpec) -> str:
        """Found by its comment among the jobs slurmctld still holds (finished ones for
        MinJobAge, 300 s by default, which a resumed handover is well inside)."""
        for held in self._call("GET", "jobs").get("jobs") or []:
            if job.key and held.get("comment") == job.key:
                return str(held["job_id"])
        return self.submit(job)

    def job_state(self, job_id: str) -> str:
        jobs = self._call("GET", f"job/{job_id}").get("jobs") or []
        if not jobs:
            raise BackendError(f"slurmrestd knows no job {job_id}")
        return str(jobs[0].get("job_state") or "UNKNOWN")

    # -- reading ----------------------------------------------------------------------------

    def _ours(self, node: dict) -> bool:
        return not self.partitions or bool(set(node.get("partitions") or []) & set(self.partitions))

    def _machine(self, node: dict) -> Machine:
        cards = gres_cards(node.get("gres"))
        used = sum(gres_cards(node.get("gres_used")).values())
        state, reason = scheduling_state_of(node)
        return Machine(
            name=node["name"],
            cards=[{"name": n, "count": c} for n, c in sorted(cards.items())],
            cards_used=used,
            state=state,
            reason=reason,
            detail={
                "slurm_state": node.get("state", ""),
                "state_flags": node.get("state_flags") or [],
                "partitions": node.get("partitions") or [],
                "gres": node.get("gres", ""),
                "gres_used": node.get("gres_used", ""),
            },
        )

    # -- the HTTP conversation --------------------------------------------------------------

    def _token(self) -> str:
        token = read_token(
            env_key="slurm_token_env",
            env_name=self.token_env,
            file_key="slurm_token_file",
            file_path=self.token_file,
        )
        return token.removeprefix("SLURM_JWT=").strip()  # as `scontrol token` prints it

    def _call(self, method: str, path: str, **kwargs) -> dict:
        url = f"{self.url}/slurm/{self.api_version}/{path}"
        headers = {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": self._token()}
        try:
            response = httpx.request(method, url, headers=headers, timeout=TIMEOUT, **kwargs)
        except httpx.ConnectError as exc:  # never sent: nothing can have been taken
            raise BackendError(
                f"slurmrestd at {self.url} did not answer: {type(exc).__name__}"
            ) from None
        except httpx.HTTPError as exc:
            raise OutcomeUnknown(
                f"slurmrestd at {self.url} did not answer: {type(exc).__name__}"
            ) from None
        body = _json(response)
        errors = [e for e in (body.get("errors") or []) if isinstance(e, dict)]
        if response.status_code == 401:
            raise BackendError(
                "slurmrestd refused the credentials (401): check slurm_user and "
                "the token in slurm_token_env / slurm_token_file"
            )
        if response.status_code >= 400 or errors:
            raise BackendError(
                f"slurmrestd answered {response.status_code}: "
                f"{_describe(errors) or response.text[:200]}"
            )
        return body


def scheduling_state_of(node: dict) -> tuple[str, str]:
    """Slurm's view as a scheduling state: down is gone, DRAIN a cordon the console did not
    make; both keep Slurm's own reason."""
    state = str(node.get("state") or "").lower()
    flags = {str(flag).upper() for flag in node.get("state_flags") or []}
    reason = node.get("reason") or ""
    if state in _GONE_STATES or flags & _GONE_FLAGS:
        return SchedulingState.GONE, f"Slurm: {state or 'unknown'} {reason}".strip()
    if "DRAIN" in flags or state in _DRAIN_STATES:
        return SchedulingState.CORDONED, f"Slurm drain: {reason or 'no reason given'}"
    return SchedulingState.SCHEDULABLE, ""


def _json(response: httpx.Response) -> dict:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _describe(errors: list[dict]) -> str:
    described = []
    for error in errors:
        text = error.get("description") or error.get("error") or ""
        if error.get("errno") == -1 or error.get("error_number") == -1:
            text += " (how Slurm 22.05 answers a token it cannot verify)"
        described.append(text)
    return "; ".join(described)
