"""``tuneplane``: submit work to a Tuneplane console, see where it runs or why it waits,
follow its output, read its history; and, for administrators, cordon, drain, resume and
remove nodes, mint join tokens and set a Fleet's quotas.

Every command speaks the console's REST API with the token ``tuneplane login`` stored. An
error the console answers is printed as its ``error.message`` (a refusal with its reason)
and exits 1; a console that cannot be reached is named; ``logs -f`` exits with the member's
own exit code."""

import sys
import time

import click

from . import __version__, config, operators, render
from .client import ApiError, Client, Unreachable
from .kinds import Kind, episode_id, kind_named, runs_on, waiting
from .spec import SpecError, read_spec, spec_line, spec_lines

# How long apply waits for the allocator's first decision, and how often it looks.
DECISION_WAIT = 10.0
POLL_SECONDS = 0.5
# How much of a member's output one logs request asks for while following.
CHUNK = 65536
ENDED = {"succeeded", "failed", "lost", "cancelled", "abandoned", "timed_out"}
# A member (an episode) its node has not started yet: no output to read.
WAITING = {"queued", "starting"}
# How long a follower waits for a member's node that does not answer before it gives up.
UNANSWERED = 60.0
# What a record is in once nothing of it runs any more: a job's, an episode's, a
# deployment's or a playground session's end.
DONE = ENDED | {"stopped"}


class Commands(click.Group):
    """The console's errors, printed once for every command."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ApiError as error:
            click.echo(_said(error), err=True)
            ctx.exit(1)
        except (Unreachable, config.ConfigError, SpecError) as error:
            click.echo(f"error: {error}", err=True)
            ctx.exit(1)


def _said(error: ApiError, lines: dict[str, int] | None = None) -> str:
    """An error as the terminal shows it: every field the API refused, each once, with the
    line of the spec file that holds it when there is one."""
    details = error.error
    if details.get("reason"):
        return f"refused ({details['reason']}): {error.message}"
    fields = details.get("fields") or {}
    if not fields:
        field = f" [{details['field']}]" if details.get("field") else ""
        return f"error{field}: {error.message}"

    def one(field: str, messages: list) -> str:
        line = spec_line(lines or {}, field)
        return f"[{field}]: {f'line {line}: ' if line else ''}{' '.join(map(str, messages))}"

    if len(fields) == 1:
        return "error " + one(*next(iter(fields.items())))
    said = [f"error: {len(fields)} fields refused; nothing was changed:"]
    return "\n".join(said + [f"  {one(field, messages)}" for field, messages in fields.items()])


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tuneplane")
def cli():
    """Work on a Tuneplane console: apply a spec, get records, follow logs, read events."""


def client() -> Client:
    return Client(config.load())


@cli.command()
@click.option("--server", required=True, help="The console's URL, e.g. http://console:8000.")
@click.option(
    "--token",
    prompt=True,
    hide_input=True,
    help="An API token (manage.py create_api_token USER); asked for when not given.",
)
def login(server, token):
    """Check the token against the console, then store both (0600)."""
    checked = Client(config.Config(server=server.rstrip("/"), token=token))
    who = checked.get("/api/fleets", limit=1)
    path = config.save(server, token)
    click.echo(
        f"Logged in to {checked.server} ({who.get('count', 0)} Fleets visible); saved in {path}"
    )


@cli.command()
@click.argument("kind")
@click.argument("record_id", required=False)
@click.option("-o", "--output", type=click.Choice(render.FORMATS), default="table")
@click.option("--limit", type=click.IntRange(1, 1000), help="At most this many records.")
def get(kind, record_id, output, limit):
    """Records of KIND, or the one with RECORD_ID.

    KIND: training-jobs, lifecycle-jobs, deployments, playground-sessions, environments,
    episodes, fleets, nodes, volumes, datasets (or singular). An episode is ENV/NUMBER;
    `get episodes ENV` lists an environment's episodes. `-o json` prints the API's body."""
    kind, api = kind_named(kind), client()
    if kind.name == "episode":
        path, one = _episodes_path(record_id)
    else:
        path, one = kind.path, record_id is not None
    if one and kind.detail:
        body = api.get(kind.one(record_id))
    elif one:
        body = _found(api, kind, record_id)
    else:
        body = api.get(path, limit=limit)
    if output != "table":
        render.body(body, output)
        return
    rows = [body] if one else body["results"] if isinstance(body, dict) else body
    render.table(rows, kind.columns)


def _episodes_path(record_id) -> tuple[str, bool]:
    if record_id is None or not (record_id.isdigit() or "/" in record_id):
        raise click.UsageError(
            "Episodes are numbered per environment: `get episodes ENVIRONMENT_ID` lists "
            "them, `get episode ENVIRONMENT_ID/NUMBER` shows one."
        )
    if "/" in record_id:
        environment, number = episode_id(record_id)
        return f"/api/environments/{environment}/episodes/{number}", True
    return f"/api/environments/{record_id}/episodes", False


def _found(api: Client, kind: Kind, record_id: str) -> dict:
    """A record of a kind without a detail route, found in its list."""
    for record in api.listed(kind.path):
        if str(record.get("id")) == record_id:
            return record
    raise ApiError(404, {"code": "not_found", "message": f"{kind.name} {record_id} not found."})


@cli.command()
@click.option("-f", "--file", "path", required=True, type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="What admission would decide; nothing is made.")
@click.option("-o", "--output", type=click.Choice(render.FORMATS), default="table")
@click.option(
    "--wait",
    type=click.FloatRange(0),
    default=DECISION_WAIT,
    show_default=True,
    help="Seconds to wait for the allocator to say where it runs or why it waits.",
)
def apply(path, dry_run, output, wait):
    """Make what a YAML spec file describes.

    The file's `kind` is one of training-job, lifecycle-job, deployment, playground-session,
    environment, episode; its other keys are the API's fields. `script: {file: train.sh}`
    reads the script from a file beside the spec. Prints the id and the Fleet that admitted
    it, then where it runs or why it waits; a refusal prints its reason and exits 1."""
    kind, body = read_spec(path)
    try:
        _apply(kind, body, dry_run, output, wait)
    except ApiError as error:
        click.echo(_said(error, spec_lines(path)), err=True)
        click.get_current_context().exit(1)


def _apply(kind, body: dict, dry_run: bool, output: str, wait: float) -> None:
    api = client()
    target = kind.path
    if kind.name == "episode":
        target = kind.path.format(environment=body.pop("environment"))
    if dry_run:
        if not kind.dry_run:
            raise click.UsageError(f"{kind.plural} have no dry run.")
        answer = api.post(target, body, dry_run="true")
        if output != "table":
            render.body(answer, output)
            return
        click.echo(f"dry run: {kind.name} would be admitted to Fleet {answer.get('fleet')}")
        queue = answer.get("queue")
        if queue:
            click.echo(
                f"queue: position {queue.get('position_in_project')} in its project, "
                f"{queue.get('position_in_fleet')} in the Fleet"
            )
        allocation = answer.get("allocation")
        if allocation:
            click.echo(_previewed(allocation))
        said = {"fleet", "queue", "allocation", "dry_run", "id"}
        rest = {k: v for k, v in answer.items() if k not in said and v not in (None, [], {}, "")}
        render.body(rest, "yaml")
        return
    made = api.post(target, body)
    if output != "table":
        render.body(made, output)
        return
    record_id = f"{made['environment']}/{made['number']}" if kind.name == "episode" else made["id"]
    fleet = made.get("fleet")
    admitted = f" admitted to Fleet {fleet}" if fleet else " admitted"
    if kind.name == "fleet":
        admitted = f" made ({made.get('kind')}, {made.get('state')})"
    click.echo(f"{kind.name} {record_id}{admitted}")
    if kind.name in ("environment", "fleet"):
        return
    decided = _decision(api, kind, record_id, made, wait)
    if decided is None:
        click.echo(f"not placed yet: see `tuneplane get {kind.name} {record_id}`")
    else:
        click.echo(decided)


def _previewed(allocation: dict) -> str:
    """What the allocator's next pass would do with it (the dry run's ``allocation``)."""
    if allocation.get("starts"):
        return f"would run on: {','.join(allocation.get('nodes') or [])}"
    wait = allocation.get("waiting") or {}
    preempts = allocation.get("preempts") or []
    said = f"would wait: {wait.get('reason', '')}: {wait.get('message', '')}".rstrip(": ")
    victims = ", ".join(str(victim.get("job", victim)) for victim in preempts)
    return said + (f" (preempting {victims})" if preempts else "")


def _decision(api: Client, kind: Kind, record_id, record: dict, wait: float) -> str | None:
    """Where it runs, or why it waits, once the allocator has said; None if not within
    ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        nodes = runs_on(record)
        why = waiting(_current(record))
        if nodes:
            return f"runs on: {nodes}"
        if why:
            return f"waits: {why}"
        if record.get("state") in ENDED:
            return f"ended {record['state']}: {record.get('reason') or ''}".rstrip(": ")
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_SECONDS)
        record = api.get(kind.one(str(record_id)))


def _current(record: dict) -> dict:
    revisions = record.get("revisions")
    if revisions:
        return max(revisions, key=lambda revision: revision["number"])
    return record


@cli.command()
@click.argument("kind")
@click.argument("record_id")
@click.option("--attempt", type=int, help="The attempt (a deployment: the revision); the latest.")
@click.option("--rank", type=int, help="The member's rank (a deployment: the replica); 0.")
@click.option(
    "-f", "--follow", is_flag=True, help="Follow until the member ends; exit with its code."
)
@click.option("--tail-bytes", type=click.IntRange(1), help="The most bytes of its tail to show.")
@click.option(
    "--interval",
    type=click.FloatRange(0.1),
    default=1.0,
    show_default=True,
    help="Seconds between two reads while following.",
)
def logs(kind, record_id, attempt, rank, follow, tail_bytes, interval):
    """A member's output: its tail, or with -f all that comes until it ends.

    KIND: training-jobs, lifecycle-jobs, deployments, episodes (ENV/NUMBER)."""
    kind, api = kind_named(kind, has="logs"), client()
    if kind.logs == "episode" and (attempt is not None or rank is not None):
        raise click.UsageError("An episode has one member: no --attempt or --rank.")
    path = kind.one(record_id) + "/logs"
    params = _member_params(kind, attempt, rank)
    if not follow:
        read = api.get(path, tail_bytes=tail_bytes, **params)
        _write(read)
        return
    _follow(api, kind, record_id, attempt, rank, tail_bytes, interval)


def _follow(api: Client, kind: Kind, record_id, attempt, rank, tail_bytes, interval):
    """Its tail, then what comes after it, read by offset until the member has ended and
    a read brought all it wrote; then exits with the member's exit code."""
    path = kind.one(record_id) + "/logs"
    member = _await_member(api, kind, record_id, attempt, rank, interval)
    params = _member_params(kind, member["attempt"], rank)
    read = _read(api, path, interval, tail_bytes=tail_bytes, **params)
    _write(read)
    offset = read["next_offset"]
    if offset is None:
        raise ApiError(
            503,
            {"message": "The member's node runs an agent too old to follow a log; upgrade it."},
        )
    while True:
        ended = _member_ended(api.get(kind.one(record_id)), kind, member["attempt"], rank)
        read = _read(api, path, interval, offset=offset, tail_bytes=CHUNK, **params)
        _write(read)
        # Nearly CHUNK (a character cut in two is left to the next read): more may be there.
        full = read["next_offset"] - offset > CHUNK - 4
        offset = read["next_offset"]
        if full:
            continue
        if ended is not None:  # it ended before this read: the read brought the rest
            sys.exit(ended)
        time.sleep(interval)


def _read(api: Client, path: str, interval: float, **params) -> dict:
    """One read; a node not answering for a while (its agent restarting) is waited for."""
    deadline = time.monotonic() + UNANSWERED
    while True:
        try:
            return api.get(path, **params)
        except ApiError as error:
            if error.status != 503 or time.monotonic() >= deadline:
                raise
        time.sleep(interval)


def _member_params(kind: Kind, attempt, rank) -> dict:
    if kind.logs == "job":
        return {"attempt": attempt, "rank": rank}
    if kind.logs == "replica":
        return {"revision": attempt, "replica": rank}
    return {}


def _write(read: dict) -> None:
    if read.get("truncated"):
        click.echo(
            f"[older output was removed at the member's log limit; from byte {read['offset']}]",
            err=True,
        )
    sys.stdout.write(read["output"])
    sys.stdout.flush()


def _members(record: dict, kind: Kind, attempt) -> tuple[int | None, list]:
    """The attempt's (a deployment: the revision's) number and members; the latest's
    unless one is named."""
    runs = record.get("attempts" if kind.logs == "job" else "revisions") or []
    if attempt is not None:
        runs = [run for run in runs if run["number"] == attempt]
    latest = max(runs, key=lambda run: run["number"], default=None)
    return (None, []) if latest is None else (latest["number"], latest["members"])


def _await_member(api: Client, kind: Kind, record_id, attempt, rank, interval) -> dict:
    """Waits until the member to follow has been started by its node (it may be queued, or
    placed and not started yet: its node has no output of it until then); its attempt."""
    while True:
        record = api.get(kind.one(record_id))
        if kind.logs == "episode":
            if record["state"] not in WAITING:
                return {"attempt": None}
        else:
            number, members = _members(record, kind, attempt)
            if any(m["rank"] == (rank or 0) and m["state"] not in WAITING for m in members):
                return {"attempt": number}
        if record.get("state") in ENDED or record.get("state") == "stopped":
            raise ApiError(
                404,
                {
                    "code": "not_found",
                    "message": f"{kind.name} {record_id} ended {record['state']} before that "
                    f"member ran: {record.get('reason') or 'no reason given'}.",
                },
            )
        time.sleep(interval)


def _member_ended(record: dict, kind: Kind, attempt, rank) -> int | None:
    """The member's exit code once it has ended (1 when it ended without one); else None."""
    if kind.logs == "episode":
        state, code = record["state"], record.get("exit_code")
    else:
        _, members = _members(record, kind, attempt)
        member = next((m for m in members if m["rank"] == (rank or 0)), None)
        if member is None:
            return None
        state, code = member["state"], member.get("exit_code")
    if state not in ENDED:
        return None
    if isinstance(code, int):
        return code
    return 0 if state == "succeeded" else 1


@cli.command()
@click.argument("kind")
@click.argument("record_id")
@click.option("--wait", "wait_", is_flag=True, help="Wait until it has ended; print how.")
@click.option(
    "--timeout",
    type=click.FloatRange(0),
    default=600.0,
    show_default=True,
    help="With --wait: seconds to wait before giving up (exit 1; it goes on ending).",
)
def cancel(kind, record_id, wait_, timeout):
    """Cancel a job or an episode, stop a deployment, end a playground session.

    A queued job ends at once; a running one is stopped — SIGTERM, SIGKILL after its grace —
    and prints `cancelling` until then: --wait waits for its end and prints it."""
    kind, api = kind_named(kind, has="cancel"), client()
    if kind.cancel == "post":
        record = api.post(kind.one(record_id) + "/cancel")
    elif kind.cancel == "stop":
        record = api.request("PATCH", kind.one(record_id), body={"state": "stopped"})
    else:
        record = api.request("DELETE", kind.one(record_id))
    state = record.get("state")
    click.echo(f"{kind.name} {record_id}: {state if state in DONE else 'cancelling'}")
    if not wait_ or state in DONE:
        return
    deadline = time.monotonic() + timeout
    while record.get("state") not in DONE:
        if time.monotonic() >= deadline:
            raise click.ClickException(
                f"{kind.name} {record_id} is still {record.get('state')} after {timeout:g} s; "
                "it goes on ending."
            )
        time.sleep(POLL_SECONDS)
        record = api.get(kind.one(record_id))
    reason = record.get("reason") or ""
    click.echo(f"{kind.name} {record_id}: {record['state']}" + (f" ({reason})" if reason else ""))


@cli.command()
@click.argument("kind")
@click.argument("record_id")
@click.option("-o", "--output", type=click.Choice(render.FORMATS), default="table")
def events(kind, record_id, output):
    """What happened to a record, oldest first: its audit events and its parts', one line
    each — when, what, to which part, by whom, and the fields it changed. `-o json` prints
    the API's body, for scripts."""
    kind, api = kind_named(kind, has="events"), client()
    path = kind.one(record_id) + "/events"
    if output != "table":
        render.body(api.get(path), output)
        return
    for event in api.listed(path):
        click.echo(render.event_line(event))


for command in operators.COMMANDS:
    cli.add_command(command)


def main():
    cli(prog_name="tuneplane")
