"""The reference pages that are generated, never written by hand, so they cannot drift.

An MkDocs hook (mkdocs.yml's ``hooks:``). A page in docs/ holds a marker, an HTML comment
``<!-- tuneplane:NAME -->``, which ``on_page_markdown`` replaces, at each build, with what
``GENERATORS[NAME]`` renders from the code:

- ``settings``: every ``TUNEPLANE_*`` environment setting of tuneplane/settings.py, its
  default and the comment above it, read from the source with ``ast`` (no Django needed);
- ``agent``: ``tuneplane-node``'s commands and options, from its own argparse parser;
- ``cli``: ``tuneplane``'s commands and options, from its own click group;
- ``api``: the API's paths and operations, from ``manage.py spectacular`` run at build time
  (the document itself is written beside the page as reference/openapi.json);
- ``fields``: every field a spec file takes for each kind, from the API's request bodies in
  the same document (the serializers' own);
- ``control-proto``: proto/tuneplane/node/v1/control.proto, whole.

tests/docs/ holds that every setting is on the page and that the defaults are the code's.
Everything it reads is in the repository; the numbered rules (reference/rules.md) are
written, not generated.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ROOT / "tuneplane" / "settings.py"
PROTO = ROOT / "proto" / "tuneplane" / "node" / "v1" / "control.proto"
MARKER = re.compile(r"<!-- tuneplane:([a-z-]+) -->")
READERS = {"env_seconds": "seconds", "env_bool": "boolean", "get": "text"}

# A few settings share the comment of the group they stand in, or have none in the code:
# what README says of each. A note never overrides the code's own comment, and a note for a
# setting that no longer exists fails tests/docs/test_settings_reference.py.
NOTES = {
    "TUNEPLANE_VAR_DIR": "Where the embedded defaults live: the SQLite file, the filesystem "
    "broker, the secret key, the CA (`pki/`), the agent's and the CLI's wheels "
    "(`downloads/`).",
    "TUNEPLANE_SECRET_KEY": "Django's secret key; otherwise a random one kept in "
    "`$TUNEPLANE_VAR_DIR/secret_key`.",
    "TUNEPLANE_DEBUG": "Django's debug mode, off unless set, under `make run` too: its error "
    "pages show settings, never for a production console (R23).",
    "TUNEPLANE_ALLOWED_HOSTS": "Comma-separated host names the web answers for.",
    "TUNEPLANE_DB_CONN_MAX_AGE": "Seconds a database connection is kept between requests "
    "(0: one per request).",
    "TUNEPLANE_HSTS_SECONDS": "HSTS's max-age, with `TUNEPLANE_HTTPS=1` only.",
    "TUNEPLANE_PUBLIC_URL": "The URL agents and the install one-liner are given for the console.",
    "TUNEPLANE_GATEWAY_TARGET": "The gateway's HOST:PORT that joined agents are told to "
    "connect to.",
    "TUNEPLANE_PKI_DIR": "The console's CA and the gateway's certificate.",
    "TUNEPLANE_DOWNLOADS_DIR": "The agent's and the CLI's wheels served under `/downloads/`.",
    "TUNEPLANE_JOIN_TOKEN_TTL": "How long a join token may be redeemed (J2).",
    "TUNEPLANE_NODE_CREDENTIAL_TTL": "A node's certificate lifetime; the agent rotates it "
    "before it expires (J6).",
    "TUNEPLANE_PLACEMENT_FRESHNESS": "A node takes new work only with an inventory observed "
    "within this (L1).",
    "TUNEPLANE_QUIET_TRAIN": "Silence after which a node is quiet for train.",
    "TUNEPLANE_QUIET_SERVE": "Silence after which a node is quiet for serve: its replicas are "
    "not Ready (L2).",
    "TUNEPLANE_QUIET_ENV": "Silence after which a node is quiet for env: no new episodes (L3).",
    "TUNEPLANE_SWEEP_INTERVAL": "How often the liveness sweep runs (Celery beat).",
    "TUNEPLANE_ALLOCATION_RESERVE_AFTER": "A job waiting longer than this reserves the nodes "
    "closest to fitting it (R2).",
    "TUNEPLANE_STOP_GRACE": "Between a member's SIGTERM and its SIGKILL (R10).",
    "TUNEPLANE_PREEMPT_GRACE": "Between a preempted member's SIGTERM and its SIGKILL, unless "
    "the job asks for less with `preemption_grace_seconds` (Q6).",
    "TUNEPLANE_RECONCILE_DEADLINE": "A gone node's members are given up this long after it "
    "is declared gone; the attempt is then `lost` (R8).",
    "TUNEPLANE_EPISODE_MAX_TIMEOUT": "The most an episode's `timeout_seconds` may be (S5).",
    "TUNEPLANE_LEASE_TTL": "How long a control session's lease outlives the node's silence.",
    "TUNEPLANE_GATEWAY_BIND": "Where a gateway (`manage.py grpcserve`) listens, mutual TLS.",
    "TUNEPLANE_TELEMETRY_FLUSH_INTERVAL": "How often a gateway writes its nodes' latest "
    "samples, in one statement.",
    "TUNEPLANE_GPU_HEALTH_QUIET": "A card judged unhealthy is healthy again after this long "
    "with no new fault.",
    "TUNEPLANE_METRICS_ALLOW": "Addresses or CIDRs (comma-separated) whose scrapes the web's, "
    "a gateway's and a worker's `/metrics` answer without the token; empty: none (R23).",
    "TUNEPLANE_GATEWAY_METRICS_BIND": "HOST:PORT a gateway serves its metrics on, plain HTTP "
    "(`grpcserve --metrics-bind`); empty: none.",
    "TUNEPLANE_WORKER_METRICS_BIND": "HOST:PORT a Celery worker serves its metrics on; "
    "empty: none.",
    "TUNEPLANE_LOGIN_FAILURE_LIMIT": "Failed logins, per username and separately per "
    "address, before django-axes locks them out (429, audited as `login.locked_out`; "
    "`manage.py axes_reset` lifts it).",
    "TUNEPLANE_LOGIN_COOLOFF": "How long a login lockout lasts.",
    "TUNEPLANE_LOG_LEVEL": "The `tuneplane` loggers' level.",
}


@dataclass
class Setting:
    """One environment setting as the code reads it."""

    line: int  # where tuneplane/settings.py reads it
    env: str  # the environment variable
    name: str  # the Django setting it becomes ("" when none: read inside a function)
    kind: str  # seconds, boolean or text
    default: object  # the default, evaluated (None: none)
    source: str  # the default as written in the code
    minimum: int | None  # seconds: the least accepted
    comment: str  # the comment above it in the code, or its note

    @property
    def default_text(self) -> str:
        value = self.default
        if value is None or value == "":
            return "(none)"
        if self.kind == "boolean":
            return "on" if value else "off"
        if isinstance(value, PurePosixPath):
            return f"`{value}`"
        if self.kind == "seconds":
            return f"{value} s{_human(value)}"
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
            return (
                f"{value} ({value >> 20} MiB)"
                if value < 1 << 30
                else f"{value} ({value >> 30} GiB)"
            )
        return f"`{value}`"


def _human(seconds: int) -> str:
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds > 60 and seconds % size == 0:
            n = seconds // size
            return f" ({n} {'day' if unit == 'days' and n == 1 else unit})"
    return ""


def _evaluate(node: ast.expr | None):
    """A default as the code computes it, with the checkout and the var dir as names."""
    if node is None:
        return None
    names = {
        "BASE_DIR": PurePosixPath("<checkout>"),
        "VAR_DIR": PurePosixPath("$TUNEPLANE_VAR_DIR"),
        "str": str,
        "int": int,
        "Path": PurePosixPath,
    }
    return eval(compile(ast.Expression(node), "<default>", "eval"), {"__builtins__": {}}, names)


def _comment_above(lines: list[str], lineno: int) -> str:
    """The ``#`` lines right above line ``lineno`` (1-based), joined."""
    said: list[str] = []
    index = lineno - 2
    while index >= 0 and lines[index].strip().startswith("#"):
        said.insert(0, lines[index].strip().lstrip("#").strip())
        index -= 1
    return " ".join(said)


def read_settings(path: Path = SETTINGS) -> list[Setting]:
    """Every ``TUNEPLANE_*`` environment variable tuneplane/settings.py reads, in its order."""
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    parents: dict[ast.AST, ast.AST] = {}
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            parents[child] = parent
    found: dict[str, Setting] = {}
    for call in ast.walk(tree):
        if not (
            isinstance(call, ast.Call)
            and call.args
            and isinstance(call.args[0], ast.Constant)
            and isinstance(call.args[0].value, str)
            and call.args[0].value.startswith("TUNEPLANE_")
        ):
            continue
        reader = call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id
        if reader not in READERS:
            continue
        env = call.args[0].value
        default = call.args[1] if len(call.args) > 1 else None
        minimum = next((k.value for k in call.keywords if k.arg == "minimum"), None)
        if reader == "env_seconds" and minimum is None:
            minimum = 1
        # The statement that reads it, and the statements around it, nearest first.
        statements, node = [], call
        while node in parents:
            node = parents[node]
            if isinstance(node, ast.stmt):
                statements.append(node)
        name = ""
        in_function = any(isinstance(s, ast.FunctionDef) for s in statements)
        if (
            not in_function
            and isinstance(statements[0], ast.Assign)
            and isinstance(statements[0].targets[0], ast.Name)
        ):
            name = statements[0].targets[0].id
        comment = next((said for s in statements if (said := _comment_above(lines, s.lineno))), "")
        comment = NOTES.get(env) or comment
        minimum_value = minimum.value if isinstance(minimum, ast.Constant) else minimum
        found.setdefault(
            env,
            Setting(
                line=call.lineno,
                env=env,
                name=name,
                kind=READERS[reader],
                default=_evaluate(default),
                source=ast.unparse(default) if default is not None else "",
                minimum=minimum_value,
                comment=comment,
            ),
        )
    return sorted(found.values(), key=lambda setting: setting.line)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_settings(path: Path = SETTINGS) -> str:
    rows = [
        "| setting | default | what it does |",
        "| - | - | - |",
    ]
    for setting in read_settings(path):
        what = setting.comment
        if setting.kind == "seconds" and setting.minimum == 0:
            what += " 0 is allowed."
        name = f"`{setting.env}`"
        if setting.name and setting.name != setting.env:
            name += f" (sets `{setting.name}`)"
        rows.append(f"| {name} | {_cell(setting.default_text)} | {_cell(what)} |")
    return "\n".join(rows) + "\n"


def render_agent() -> str:
    """``tuneplane-node``'s commands and options, from its own parser."""
    sys.path.insert(0, str(ROOT))
    try:
        from nodes.agent.cli import parser
    finally:
        sys.path.remove(str(ROOT))
    import argparse

    root = parser()
    out = []

    def options(command: argparse.ArgumentParser) -> list[str]:
        rows = ["| option | what it does |", "| - | - |"]
        for action in command._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            flags = ", ".join(f"`{flag}`" for flag in action.option_strings)
            rows.append(f"| {flags} | {_cell(action.help or '')} |")
        return rows

    out.append("Options of every command (before the command's name):\n")
    out += options(root)
    subparsers = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in subparsers._choices_actions}
    for name, command in subparsers.choices.items():
        out.append(f"\n### `tuneplane-node {name}`\n\n{helps.get(name, '')}\n")
        out += options(command)
    return "\n".join(out) + "\n"


def _option_help(option) -> str:
    import click

    said = option.help or ""
    if isinstance(option.type, click.Choice):
        said += f" One of {', '.join(f'`{c}`' for c in option.type.choices)}"
        said += f"; default `{option.default}`." if option.default else "."
    return said.strip() or option.human_readable_name.upper()


def render_cli() -> str:
    """``tuneplane``'s commands and options, from its own click group."""
    import click
    from tuneplane_cli.main import cli

    out = []
    context = click.Context(cli, info_name="tuneplane")
    for name in cli.list_commands(context):
        command = cli.get_command(context, name)
        usage = " ".join(command.collect_usage_pieces(context))
        out.append(f"### `tuneplane {name}`\n\n`tuneplane {name} {usage}`\n")
        help_text = (command.help or "").strip().split("\n\n")[0]
        out.append(" ".join(help_text.split()) + "\n")
        rows = [
            f"| {', '.join(f'`{o}`' for o in p.opts)} | {_cell(_option_help(p))} |"
            for p in command.params
            if isinstance(p, click.Option)
        ]
        if rows:
            out += ["| option | what it does |", "| - | - |", *rows, ""]
    return "\n".join(out) + "\n"


def openapi_document() -> dict:
    """The API's OpenAPI document, as `manage.py spectacular` writes it now."""
    with tempfile.TemporaryDirectory() as scratch:
        target = Path(scratch) / "openapi.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEPLANE_")}
        env.update(TUNEPLANE_VAR_DIR=scratch, DJANGO_SETTINGS_MODULE="tuneplane.settings")
        env.pop("DATABASE_URL", None)
        env.pop("REDIS_URL", None)
        subprocess.run(
            [sys.executable, "manage.py", "spectacular", "--format", "openapi-json"]
            + ["--file", str(target)],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            timeout=300,
        )
        return json.loads(target.read_text())


def render_api(document: dict) -> str:
    out = []
    by_tag: dict[str, list[tuple[str, str, dict]]] = {}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if method in {"get", "post", "put", "patch", "delete"}:
                tag = (operation.get("tags") or ["other"])[0]
                by_tag.setdefault(tag, []).append((path, method, operation))
    for tag in sorted(by_tag):
        out.append(f"\n### {tag}\n")
        out.append("| method | path | what it does |")
        out.append("| - | - | - |")
        for path, method, operation in by_tag[tag]:
            said = operation.get("summary") or operation.get("description", "")
            said = said.strip().split("\n\n")[0]
            out.append(f"| {method.upper()} | `{path}` | {_cell(said)} |")
    info = document.get("info", {})
    head = f"{info.get('title', 'API')} {info.get('version', '')}: "
    head += (
        f"{sum(len(v) for v in by_tag.values())} operations on {len(document['paths'])} paths.\n"
    )
    return head + "\n".join(out) + "\n"


# Each kind a spec file (or the API) makes: the path whose POST makes it, and its name.
SPEC_KINDS = (
    ("training-job", "/api/training-jobs", "A training job"),
    ("lifecycle-job", "/api/lifecycle-jobs", "A lifecycle job"),
    ("deployment", "/api/deployments", "A deployment"),
    ("playground-session", "/api/playground-sessions", "A playground session"),
    ("environment", "/api/environments", "An environment"),
    ("episode", "/api/environments/{environment_id}/episodes", "An episode"),
    ("volume", "/api/volumes", "A volume"),
    ("dataset", "/api/datasets", "A dataset"),
    ("fleet", "/api/fleets", "A Fleet, an administrator's (its `kind` is `fleet_kind` in a spec)"),
)


def _schema(document: dict, schema: dict) -> dict:
    ref = schema.get("$ref") or next(
        (part["$ref"] for part in schema.get("allOf", []) if "$ref" in part), None
    )
    if ref:
        return document["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return schema


def _type(document: dict, schema: dict) -> str:
    schema = _schema(document, schema) if ("$ref" in schema or "allOf" in schema) else schema
    if "enum" in schema:
        return "one of " + ", ".join(f"`{value}`" for value in schema["enum"] if value)
    kind = schema.get("type", "object")
    if kind == "array":
        return f"list of {_type(document, schema.get('items', {}))}"
    if kind == "object" and "properties" in schema:
        return "{" + ", ".join(f"`{name}`" for name in schema["properties"]) + "}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return "names to " + _type(document, schema["additionalProperties"])
    bounds = []
    if "minimum" in schema or "maximum" in schema:
        bounds.append(f"{schema.get('minimum', '')}–{schema.get('maximum', '')}")
    if "maxLength" in schema and kind == "string":
        bounds.append(f"at most {schema['maxLength']} characters")
    if "maxItems" in schema:
        bounds.append(f"at most {schema['maxItems']}")
    word = {"integer": "integer", "number": "number", "string": "text", "boolean": "boolean"}
    return word.get(kind, kind) + (f" ({', '.join(bounds)})" if bounds else "")


def render_fields(document: dict) -> str:
    """Every field a spec file (or the API's create) takes for each kind, from the request
    bodies of the OpenAPI document: the serializers' own, so this page cannot drift."""
    out = []
    for kind, path, name in SPEC_KINDS:
        operation = document["paths"][path]["post"]
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        schema = _schema(document, body)
        required = set(schema.get("required", []))
        out += [f"\n### {kind} {{#{kind}}}\n", f"{name}: `POST {path}`.\n"]
        out += ["| field | required | type | default | what it is |", "| - | - | - | - | - |"]
        for field, spec in schema["properties"].items():
            if spec.get("readOnly"):
                continue
            default = spec.get("default")
            shown = "" if default in (None, "", [], {}) else f"`{json.dumps(default)}`"
            said = spec.get("description") or _schema(document, spec).get("description", "")
            said = "" if said.startswith("A request body") else said
            said = re.split(r"(?:^|\n\n)\* `", said)[0]  # the enum's list: in the type
            out.append(
                f"| `{field}` | {'yes' if field in required else ''} | "
                f"{_cell(_type(document, spec))} | {shown} | {_cell(said)} |"
            )
    return "\n".join(out) + "\n"


def render_proto(path: Path = PROTO) -> str:
    return f"```protobuf\n{path.read_text()}```\n"


_document: dict | None = None


def _api_document() -> dict:
    global _document
    if _document is None:
        _document = openapi_document()
    return _document


GENERATORS = {
    "settings": render_settings,
    "agent": render_agent,
    "cli": render_cli,
    "api": lambda: render_api(_api_document()),
    "fields": lambda: render_fields(_api_document()),
    "control-proto": render_proto,
}


# --- MkDocs' events ---


def on_files(files, config, **_):
    from mkdocs.structure.files import File

    files.append(
        File.generated(
            config,
            "reference/openapi.json",
            content=json.dumps(_api_document(), indent=2),
        )
    )
    return files


def on_page_markdown(markdown, page, config, files, **_):
    def generate(match):
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"{page.file.src_uri}: no generator for marker {name!r}")
        return GENERATORS[name]()

    return MARKER.sub(generate, markdown)
