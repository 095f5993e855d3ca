"""A card's health checks (DESIGN §9, H5): when one is due, what its result makes of the card,
and whether the card may take work — pure functions of plain data, with no database and no
clock of their own (tests/nodes/test_checks.py). nodes.services.checks reads the rows, asks
here, and writes the answer, audited.

A Fleet's ``config.health_check`` names a shell command. Each node runs it on each card alone,
confined like a member (its uid, its namespaces, only that card's device): before the card
first takes work, after every member that held it, and every ``interval_seconds`` while it is
idle. A check that has not ended ``timeout_seconds`` after it started is stopped and failed.

A card's record (Node.card_checks, by UUID) moves through four states:

    due       a check is owed (never checked; a member left it; quarantined since)
    checking  its check runs (``command``); its result, once known, waits for the check's
              cleanup (the node holds the card until then, R7)
    passed    its last check exited 0: it takes new work
    failed    its last check did not: quarantined (H6) — out of work until it returns —
              as its Fleet's breaker admits (H7); one the breaker spares keeps working

A passed or failed card is due again ``interval_seconds`` after its last result.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

DUE, CHECKING, PASSED, FAILED = "due", "checking", "passed", "failed"
STATES = (DUE, CHECKING, PASSED, FAILED)
INTERVAL, TIMEOUT = 300, 60
# How much of a check's output is kept with its result (its tail: where errors are).
MAX_OUTPUT = 200
# The label a check's start carries: what tells it from a member on the node and the console.
LABEL = "TUNEPLANE_HEALTH_CHECK"


@dataclass(frozen=True)
class HealthCheck:
    """A Fleet's health check, as its config says (validated by tuneplane.deployment_settings)."""

    command: str
    interval: timedelta
    timeout: timedelta

    @classmethod
    def of(cls, config) -> "HealthCheck | None":
        """The check ``config`` names, or None where it names none usable."""
        said = (config or {}).get("health_check") if isinstance(config, dict) else None
        if not isinstance(said, dict):
            return None
        command = said.get("command")
        if not isinstance(command, str) or not command.strip():
            return None
        return cls(
            command,
            timedelta(seconds=_whole(said.get("interval_seconds"), INTERVAL)),
            timedelta(seconds=_whole(said.get("timeout_seconds"), TIMEOUT)),
        )

    def payload(self, card: dict, grace: float) -> dict:
        """The start that runs it on one card (``{"index", "uuid"}``), as a member's is."""
        return {
            "script": self.command,
            "cards": [{"index": card["index"], "uuid": card["uuid"]}],
            "env": {"TUNEPLANE_HEALTH_CHECK_CARD": str(card["index"])},
            "labels": {LABEL: card["uuid"]},
            "grace_seconds": grace,
            "health_check": True,
        }


def _whole(value, default: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return default
    return value


def placeable(record: dict | None) -> bool:
    """H5: whether a card of a Fleet with a health check may take new work as far as its
    checks go: once its last check ended — never one not checked yet, owed a check, or whose
    check runs. A check that failed quarantined its card (H6), which holds it out of work on
    its own; one the breaker did not quarantine (H7) leaves it in service, its failure shown."""
    return record is not None and record.get("state") in (PASSED, FAILED)


def due(record: dict | None, now: datetime, interval: timedelta) -> bool:
    """H5: whether an idle card's check is owed now: never checked, owed (a member left it,
    it was quarantined since), or its last result ``interval`` old or older."""
    if record is None or record.get("state") == DUE:
        return True
    if record.get("state") != PASSED and record.get("state") != FAILED:
        return False  # checking
    return now - datetime.fromisoformat(record["at"]) >= interval


def started(record: dict | None, *, index: int, command: str, now: datetime) -> dict:
    """Its check is sent: checking, by ``command``, from ``now``; what it knew kept."""
    return {
        **(record or {}),
        "index": index,
        "state": CHECKING,
        "command": command,
        "started_at": now.isoformat(),
        "result": None,
    }


def timed_out(record: dict | None, now: datetime, timeout: timedelta) -> bool:
    """H5: a check running ``timeout`` or longer with no result yet."""
    return (
        record is not None
        and record.get("state") == CHECKING
        and record.get("result") is None
        and now - datetime.fromisoformat(record["started_at"]) >= timeout
    )


def finished(
    record: dict, *, passed: bool, exit_code: int | None, output: str, now: datetime
) -> dict:
    """Its check's result is known (it waits for the cleanup to become the card's state):
    passes in a row counted, the exit code and the output's tail kept. A second result for
    the same check (a timeout, then the stopped process's exit) changes nothing."""
    if record.get("result") is not None:
        return record
    return {
        **record,
        "result": PASSED if passed else FAILED,
        "exit_code": exit_code,
        "output": output[-MAX_OUTPUT:],
        "at": now.isoformat(),
        # A check that began before the card was owed one proves nothing since.
        "passes": record.get("passes", 0) + 1 if passed and not record.get("owed") else 0,
    }


def cleaned(record: dict, now: datetime) -> dict:
    """Its check's cleanup is confirmed: the card's state is its result; a check that ended
    with none (lost with its node), or that the card was owed another check during, is owed
    again."""
    result = record.get("result")
    if record.get("owed") or result not in (PASSED, FAILED):
        return {**record, "state": DUE, "command": None, "owed": False, "at": now.isoformat()}
    return {**record, "state": result, "command": None}


def owed(record: dict | None, now: datetime) -> dict | None:
    """A member left the card, or it was quarantined: its next check is owed at once and its
    passes count from zero. A check already running goes on; none known stays none."""
    if record is None:
        return None
    if record.get("state") == CHECKING:
        return {**record, "passes": 0, "owed": True}
    return {**record, "state": DUE, "passes": 0, "at": now.isoformat()}


def reason(record: dict) -> str:
    """Why a failed check quarantines its card, as the card's reason says it."""
    code = record.get("exit_code")
    said = "timed out" if record.get("timed_out") else f"exit {code}"
    tail = (record.get("output") or "").strip().splitlines()
    return f"health check failed ({said})" + (f": {tail[-1]}" if tail else "")


def shown(record: dict | None) -> dict | None:
    """A card's last health check as the API and the admin show it; None: never checked (or
    its Fleet has no check)."""
    if record is None:
        return None
    return {
        "state": record.get("state"),
        "at": record.get("at"),
        "exit_code": record.get("exit_code"),
        "output": record.get("output", ""),
        "passes": record.get("passes", 0),
    }
