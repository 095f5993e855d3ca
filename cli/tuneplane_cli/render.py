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


def body(data, output: str) -> None:
    """The API's body as it answered, in JSON or YAML."""
    if output == "json":
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), nl=False)
