"""A ``slurm`` Fleet read through slurmrestd, and handed its jobs there (DESIGN.md §6).

Slurm is the allocator (P7): the console reads what the partitions hold and submits what it
admitted; it never places work on a Slurm node itself. The JWT comes from an environment
variable or a file named in the Fleet's config at each call: never the token itself in the
Fleet record, a log line or an error message.

The API version is the Fleet's ``slurm_api_version``, else the newest of those the console
speaks (slurm_api.py) that the cluster offers, found by asking each for ``ping``, newest
first, and kept for NEGOTIATED_FOR: a cluster upgraded is spoken to in its new version soon
after, without a config change.
"""

import re
import time
from dataclasses import dataclass

import httpx

from ..choices import SchedulingState
from .base import BackendError, JobRead, JobSpec, Machine, OutcomeUnknown
from .credentials import read_token
from .slurm_api import DIALECTS, Dialect, Submission

TIMEOUT = httpx.Timeout(10.0, connect=3.0)
NEGOTIATED_FOR = 300.0  # seconds a cluster's newest version is trusted before asking again
# "gpu:h100:4", "gpu:h100:4(S:0-1)", "gpu:2", several comma-separated; in gres_used the
# index list may hold commas too ("gpu:h100:2(IDX:0,2)"), hence a pattern, not a split.
_GRES = re.compile(r"(?:^|,)gpu(?::([A-Za-z0-9_.-]+))?:(\d+)")
_GONE_STATES = {"down", "unknown", "future"}
_GONE_FLAGS = {"NOT_RESPONDING", "POWERED_DOWN", "POWER_DOWN"}
_DRAIN_STATES = {"drained", "draining", "drain"}
# What each slurmrestd (by URL) was found to offer: (version, time.monotonic() to ask again).
_negotiated: dict[str, tuple[str, float]] = {}


def gres_cards(gres: str | None) -> dict[str, int]:
    """Card counts by Slurm's GPU type name ("gpu" when the type is not given)."""
    cards: dict[str, int] = {}
    for name, count in _GRES.findall(gres or ""):
        cards[name or "gpu"] = cards.get(name or "gpu", 0) + int(count)
    return cards


@dataclass(frozen=True)
class SlurmBackend:
    url: str
    api_version: str  # "" for the newest the cluster offers
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
            api_version=config.get("slurm_api_version") or "",
            partitions=partitions,
            user=config["slurm_user"],
            token_env=config.get("slurm_token_env", ""),
            token_file=config.get("slurm_token_file", ""),
            workdir=config.get("slurm_workdir") or "/tmp",
        )

    # -- the interface --------------------------------------------------------------------

    def read(self) -> list[Machine]:
        dialect = self._dialect()
        nodes = self._call("GET", "nodes", dialect=dialect).get("nodes") or []
        return [self._machine(dialect.node(node), dialect) for node in nodes if self._ours(node)]

    def submit(self, job: JobSpec) -> str:
        dialect = self._dialect()
        gres = f"gpu:{job.series}:{job.cards}" if job.series else f"gpu:{job.cards}"
        submission = Submission(
            script=job.script,
            name=job.name,
            nodes=job.nodes,
            workdir=self.workdir,
            gres=gres if job.cards else "",
            comment=job.key,
            partition=self.partitions[0] if self.partitions else "",
        )
        answer = self._call(
            "POST", "job/submit", dialect=dialect, json=dialect.submission(submission)
        )
        return str(answer["job_id"])

    def resume(self, job: JobSpec) -> str:
        """Found by its comment among the jobs slurmctld still holds (finished ones for
        MinJobAge, 300 s by default, which a resumed handover is well inside)."""
        for held in self._call("GET", "jobs").get("jobs") or []:
            if job.key and held.get("comment") == job.key:
                return str(held["job_id"])
        return self.submit(job)

    def job_state(self, job_id: str) -> str:
        return self.job_read(job_id).state

    def job_read(self, job_id: str) -> JobRead:
        """The job's state, its state_reason (NodeDown, NonZeroExitCode, …) and restart_cnt:
        how often Slurm requeued it itself (a node failure under a requeueable job)."""
        dialect = self._dialect()
        jobs = self._call("GET", f"job/{job_id}", dialect=dialect).get("jobs") or []
        if not jobs:
            raise BackendError(f"slurmrestd knows no job {job_id}")
        return job_read_of(jobs[0], dialect)

    def cancel(self, job_id: str) -> None:
        """Ask Slurm to cancel the job, as scancel does (slurmrestd's job delete). A job
        already finished, or one Slurm no longer holds, has nothing left to cancel."""
        self._call("DELETE", f"job/{job_id}", finished_is_done=True)

    # -- reading ----------------------------------------------------------------------------

    def _ours(self, node: dict) -> bool:
        return not self.partitions or bool(set(node.get("partitions") or []) & set(self.partitions))

    def _machine(self, node: dict, dialect: Dialect) -> Machine:
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
                "slurm_api_version": dialect.version,
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

    def _dialect(self) -> Dialect:
        """The configured version's dialect, else the newest the cluster offers."""
        if self.api_version:
            if self.api_version not in DIALECTS:
                raise BackendError(
                    f"config.slurm_api_version {self.api_version} is not one the console "
                    f"speaks: {', '.join(DIALECTS)}"
                )
            return DIALECTS[self.api_version]
        version, ask_again = _negotiated.get(self.url, ("", 0.0))
        if version and time.monotonic() < ask_again:
            return DIALECTS[version]
        for version in DIALECTS:  # newest first
            response = self._request("GET", f"/slurm/{version}/ping")
            if response.status_code != 404:
                self._answer(response)  # a refused token says so here, not as "no version"
                _negotiated[self.url] = (version, time.monotonic() + NEGOTIATED_FOR)
                return DIALECTS[version]
        raise BackendError(
            f"slurmrestd at {self.url} offers none of the API versions the console speaks "
            f"({', '.join(DIALECTS)}): start it with one of their plugins"
        )

    def _call(
        self,
        method: str,
        path: str,
        *,
        dialect: Dialect | None = None,
        finished_is_done: bool = False,
        **kwargs,
    ) -> dict:
        dialect = dialect or self._dialect()
        response = self._request(method, f"/slurm/{dialect.version}/{path}", **kwargs)
        if response.status_code == 404 and not _json(response):
            # The URL itself is unknown: the version is not served (any more).
            _negotiated.pop(self.url, None)
            raise BackendError(
                f"slurmrestd at {self.url} does not serve API {dialect.version}"
                + ("" if self.api_version else ": asking it again at the next call")
            )
        return self._answer(response, finished_is_done=finished_is_done)

    def _request(self, method: str, path: str, **kwargs) -> httpx.Response:
        headers = {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": self._token()}
        try:
            return httpx.request(
                method, self.url + path, headers=headers, timeout=TIMEOUT, **kwargs
            )
        except httpx.ConnectError as exc:  # never sent: nothing can have been taken
            raise BackendError(
                f"slurmrestd at {self.url} did not answer: {type(exc).__name__}"
            ) from None
        except httpx.HTTPError as exc:
            raise OutcomeUnknown(
                f"slurmrestd at {self.url} did not answer: {type(exc).__name__}"
            ) from None

    def _answer(self, response: httpx.Response, *, finished_is_done: bool = False) -> dict:
        body = _json(response)
        errors = [e for e in (body.get("errors") or []) if isinstance(e, dict)]
        done = finished_is_done and any(_error_number(e) in _ALREADY_FINISHED for e in errors)
        if done:
            errors = [e for e in errors if _error_number(e) not in _ALREADY_FINISHED]
        if response.status_code in (401, 511):
            raise BackendError(
                f"slurmrestd refused the credentials ({response.status_code}"
                f"{': ' + _describe(errors) if errors else ''}): check slurm_user and "
                "the token in slurm_token_env / slurm_token_file"
            )
        if errors or (response.status_code >= 400 and not done):
            raise BackendError(
                f"slurmrestd answered {response.status_code}: "
                f"{_describe(errors) or response.text[:200]}"
            )
        return body


def job_read_of(job: dict, dialect: Dialect) -> JobRead:
    """One job of slurmrestd's answer as the console reads it (H8). A requeued job's state
    is the word REQUEUED (v0.0.38), or its flag beside PENDING (["PENDING", "REQUEUED"],
    v0.0.40 on): REQUEUED either way, so it reads as the manager's own requeue."""
    state = dialect.job_state(job)
    words = job.get("job_state")
    flags = {str(word).upper() for word in words[1:]} if isinstance(words, list) else set()
    if state == "PENDING" and flags & {"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}:
        state = "REQUEUED"
    return JobRead(
        state=state,
        reason=str(job.get("state_reason") or ""),
        restarts=_number(job.get("restart_cnt")),
    )


def _number(value) -> int:
    """An integer as slurmrestd spells it: 3, or {"set": true, "number": 3} (v0.0.40 on)."""
    if isinstance(value, dict):
        value = value.get("number") if value.get("set", True) else 0
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


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


# Slurm's errno for a job that already finished (ESLURM_ALREADY_DONE) and for one it no
# longer holds (ESLURM_INVALID_JOB_ID): what cancelling a finished job answers.
_ALREADY_FINISHED = {2017, 2021}


def _error_number(error: dict):
    return error.get("error_number", error.get("errno"))


def _describe(errors: list[dict]) -> str:
    described = []
    for error in errors:
        text = error.get("description") or error.get("error") or ""
        if _error_number(error) == -1:
            text += " (how Slurm 22.05 answers a token it cannot verify)"
        described.append(text)
    return "; ".join(described)
