"""What one project reads of another's work (R23): only that it is another project's work.

Preemption writes whose work it stopped and for whom — a victim's record names its preemptor
and why, a preemptor's wait and its audit event name its victims — each beside the project of
the work it names. What a reader is shown goes through here: the names of work of a project
the reader does not read (``sees``: administrators every project's, a member their own
projects') become ``ANOTHER``, and so does the text built from them. A name whose project is
not recorded (work preempted before this was written down) is shown to administrators only.

Pure functions of the records and ``sees``: tests/placement/test_disclosure.py holds them
without a database.
"""

from collections.abc import Callable

ANOTHER = "another project's work"

Sees = Callable[[int | None], bool]


def guarantee_why(who: str) -> str:
    """Why work on borrowed cards was preempted for ``who``, waiting within its guarantee."""
    return f"{who} waits for cards within its guarantee; this job ran on borrowed cards (rule Q5)"


def preempting_message(victims: list[str], last: str) -> str:
    """Q8's ``preempting`` message: the victims by name (as shown), and the last deadline."""
    return (
        f"preempting {len(victims)} job(s) for its cards: "
        + ", ".join(victims)
        + f"; stopped by {last} at the latest"
    )


def victims_shown(victims: list[dict], sees: Sees) -> list[dict]:
    """A preemptor's victims (``{"job", "deadline", "project"}``) as the reader sees them:
    another project's job as ``ANOTHER``; the project ids themselves never shown."""
    return [
        {
            **{key: value for key, value in victim.items() if key != "project"},
            "job": victim["job"] if sees(victim.get("project")) else ANOTHER,
        }
        for victim in victims
    ]


def preemption_shown(preemption: dict | None, sees: Sees) -> dict | None:
    """A victim's last preemption as the reader sees it: a preemptor of a project the reader
    does not read is ``ANOTHER``, and so is whom its ``why`` names."""
    if not preemption:
        return preemption
    shown = {key: value for key, value in preemption.items() if key != "by_project"}
    if not sees(preemption.get("by_project")):
        shown.update(by=ANOTHER, why=guarantee_why(ANOTHER))
    return shown


def wait_shown(wait: dict | None, sees: Sees) -> dict | None:
    """Q8's reason to wait as the reader sees it: a ``preempting`` wait's victims, and its
    message, with other projects' work as ``ANOTHER``; any other reason names no work."""
    if not wait or wait.get("reason") != "preempting":
        return wait
    victims = victims_shown(wait.get("numbers", {}).get("victims", []), sees)
    if not victims:
        return wait
    last = max(victim["deadline"] for victim in victims)
    return {
        **wait,
        "message": preempting_message([victim["job"] for victim in victims], last),
        "numbers": {**wait["numbers"], "victims": victims},
    }


def event_shown(action: str, after: dict | None, sees: Sees) -> dict | None:
    """A preemption's audit event (``<kind>.preempting`` on a victim, ``<kind>.preempts`` on
    a preemptor) as a record's history shows it; any other event as it is."""
    if not after:
        return after
    if action.endswith(".preempting") and "preemption" in after:
        return {**after, "preemption": preemption_shown(after["preemption"], sees)}
    if action.endswith(".preempts") and "victims" in after:
        return {**after, "victims": victims_shown(after["victims"], sees)}
    return after
