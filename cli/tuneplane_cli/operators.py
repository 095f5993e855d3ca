"""The operators' commands: a node's cordon, drain, resume and removal, a Fleet's join tokens
and its quotas — each a thin call of the console's API (administrators; a member reads
their own projects' quota rows)."""

import click
import yaml

from . import config, render
from .client import Client


def client() -> Client:
    return Client(config.load())


def _node_shown(node: dict) -> None:
    scheduling = node.get("scheduling") or {}
    click.echo(f"node {node['id']}: {scheduling.get('state', '')}")


@click.command()
@click.argument("node")
@click.option("--reason", required=True, help="Why; shown on the node and in the audit log.")
def cordon(node, reason):
    """Stop placing new work on NODE (administrators)."""
    _node_shown(client().post(f"/api/nodes/{node}/cordon", {"reason": reason}))


@click.command()
@click.argument("node")
def uncordon(node):
    """Lift the operator's cordon on NODE: it takes work again (administrators). A draining
    or drained node is refused, naming resume, which undoes a drain."""
    _node_shown(client().post(f"/api/nodes/{node}/uncordon"))


@click.command()
@click.argument("node")
@click.option("--reason", required=True, help="Why; shown on the node and in the audit log.")
@click.option("--deadline", help="When it should be idle (ISO 8601); nothing is stopped at it.")
def drain(node, reason, deadline):
    """Drain NODE: no new work, what runs there finishes; drained once idle (administrators;
    `resume` undoes it, `remove` follows it)."""
    body = {"reason": reason, **({"deadline": deadline} if deadline else {})}
    _node_shown(client().post(f"/api/nodes/{node}/drain", body))


@click.command()
@click.argument("node")
def resume(node):
    """Undo NODE's drain: it takes work again (administrators; its cordons stay)."""
    _node_shown(client().post(f"/api/nodes/{node}/resume"))


@click.command()
@click.argument("node")
@click.option("--force", is_flag=True, help="Remove a gone machine anyway; audited as forced.")
def remove(node, force):
    """Remove a drained NODE, or with --force a gone one (administrators). Its credential dies
    at once; the machine comes back only by joining again, with a new join token."""
    removed = client().request(
        "DELETE", f"/api/nodes/{node}", params={"force": "true"} if force else None
    )
    _node_shown(removed)


@click.command("join-token")
@click.argument("fleet")
@click.option("-o", "--output", type=click.Choice(render.FORMATS), default="table")
def join_token(fleet, output):
    """Mint a single-use join token for FLEET (administrators) and print how a machine joins
    with it. The token is shown this once."""
    minted = client().post(f"/api/fleets/{fleet}/join-tokens")
    if output != "table":
        render.body(minted, output)
        return
    click.echo(f"join token {minted['id']} for Fleet {minted['fleet']}")
    click.echo(f"token (shown once; expires {minted['expires_at']}): {minted['token']}")
    click.echo(f"install: {minted['install_command']}")
    click.echo(f"join:    {minted['join_command']}")


QUOTA_COLUMNS = [
    ("PROJECT", lambda q: q["project"]),
    ("SERIES", lambda q: q["series"] or "any"),
    ("GUARANTEED", lambda q: q["guaranteed"]),
    ("LIMIT", lambda q: "unlimited" if q["limit"] is None else q["limit"]),
    ("WEIGHT", lambda q: q["weight"]),
    ("IN USE", lambda q: q["in_use"]),
    ("BORROWED", lambda q: q["borrowed"]),
    ("QUEUED", lambda q: q["queued"]),
    ("FAIR SHARE", lambda q: f"{q['fair_share']:.3g}"),
]


class QuotaCommands(click.Group):
    """``quotas FLEET`` shows; ``quotas set FLEET -f FILE`` replaces."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["show", *args]
        return super().parse_args(ctx, args)


@click.group(cls=QuotaCommands)
def quotas():
    """A Fleet's quotas: `quotas FLEET` shows them, with what each project holds, borrows
    and has queued; `quotas set FLEET -f FILE` replaces them as a whole (administrators)."""


@quotas.command("show")
@click.argument("fleet")
@click.option("-o", "--output", type=click.Choice(render.FORMATS), default="table")
def quotas_show(fleet, output):
    """FLEET's quotas (members see their own projects' rows)."""
    _quotas_shown(client().get(f"/api/fleets/{fleet}/quotas"), output)


@quotas.command("set")
@click.argument("fleet")
@click.option("-f", "--file", "path", required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Choice(render.FORMATS), default="table")
def quotas_set(fleet, path, output):
    """Replace FLEET's quotas with FILE's, as a whole (administrators; one audited change).

    FILE is YAML or JSON: `quotas:` and a list, or the list itself, each row with `project`,
    `series` ("" any card), `guaranteed`, `limit` (null: unlimited) and `weight`. An empty
    list removes every quota."""
    rows = read_quotas(path)
    answer = client().request("PUT", f"/api/fleets/{fleet}/quotas", body={"quotas": rows})
    _quotas_shown(answer, output)


def read_quotas(path: str) -> list:
    try:
        with open(path) as handle:
            data = yaml.safe_load(handle)
    except OSError as error:
        raise click.BadParameter(
            f"cannot read {path}: {error.strerror}", param_hint="FILE"
        ) from None
    except yaml.YAMLError as error:
        raise click.BadParameter(
            f"{path} is not YAML or JSON: {error}", param_hint="FILE"
        ) from None
    if isinstance(data, dict) and set(data) == {"quotas"}:
        data = data["quotas"]
    if data is None:
        data = []
    if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
        raise click.BadParameter(
            f"{path} holds no list of quotas: `quotas:` and a list of rows, or the list itself.",
            param_hint="FILE",
        )
    return data


def _quotas_shown(body: dict, output: str) -> None:
    if output != "table":
        render.body(body, output)
        return
    if not body["quotas"]:
        click.echo("no quotas: first come, first served")
        return
    render.table(body["quotas"], QUOTA_COLUMNS)


COMMANDS = [cordon, uncordon, drain, resume, remove, join_token, quotas]
