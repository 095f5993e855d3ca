"""What the commands print: a table for people, or the API's body as JSON or YAML for scripts."""

import json
import sys

import click
import yaml
from rich import box
from rich.console import Console
from rich.table import Table

FORMATS = ["table", "json", "yaml"]


def console() -> Console:
    # Piped (a script, a test), a table is not cut to 80 columns.
    wide = None if sys.stdout.isatty() else 250
    return Console(width=wide, highlight=False, soft_wrap=False)


def table(rows: list[dict], columns: list) -> None:
    shown = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for header, _ in columns:
        shown.add_column(header, overflow="fold")
    for row in rows:
        shown.add_row(*(str(read(row)) for _, read in columns))
    console().print(shown)


# How much of one changed value an event's line shows.
VALUE_WIDTH = 48


def event_line(event: dict) -> str:
    """One audit event for a terminal: its time (UTC, to the second), what happened and to
    which part, who did it, and each field it changed, old → new; values as JSON writes
    them (true, null, [a, b]), each cut to VALUE_WIDTH."""
    at = event["at"].replace("T", " ")[:19]
    kind = event["target"]["type"].rpartition(".")[2]
    actor = event["actor"].get("label") or event["actor"].get("type", "")
    line = f"{at}  {event['action']}  {kind} {event['target']['id']}  by {actor}"
    if event.get("forced"):
        line += " (forced)"
    changes = changed(event)
    return f"{line}: {changes}" if changes else line


def changed(event: dict) -> str:
    """The fields an event changed, ``key: old → new`` (``key: new`` for a new one)."""
    before, after = event.get("before") or {}, event.get("after") or {}
    keys = [key for key in {**before, **after} if before.get(key) != after.get(key)]
    return ", ".join(
        f"{key}: {value(before[key])} → {value(after.get(key))}"
        if key in before
        else f"{key}: {value(after[key])}"
        for key in keys
    )


def value(data) -> str:
    """A changed value, short: JSON's words, a list's items, a mapping's key=value."""
    if isinstance(data, str):
        said = data
    elif isinstance(data, list):
        said = "[" + ", ".join(value(item) for item in data) + "]"
    elif isinstance(data, dict):
        said = "{" + ", ".join(f"{k}={value(v)}" for k, v in data.items()) + "}"
    else:
        said = json.dumps(data)
    return said if len(said) <= VALUE_WIDTH else said[: VALUE_WIDTH - 1] + "…"


def body(data, output: str) -> None:
    """The API's body as it answered, in JSON or YAML."""
    if output == "json":
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), nl=False)
