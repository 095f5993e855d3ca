"""A spec file for ``tuneplane apply -f``: one YAML document, a mapping whose ``kind`` names
what it makes and whose other keys are the API's fields for it, sent as they are. Two keys
are the file's own:

- ``script: {file: train.sh}`` reads the script from that file (relative to the spec file)
  and sends its text as ``script``;
- a lifecycle job's API field ``kind`` (``finetune``, ...) is written ``lifecycle_kind``,
  and a Fleet's (``node``, ``slurm``, ``kubernetes``) ``fleet_kind``, since ``kind`` names
  the record;
- an episode names its environment by id (``environment: 7``): it is made under it.
"""

from pathlib import Path

import click
import yaml

from .kinds import KINDS, Kind, kind_named


class SpecError(Exception):
    pass


# A record whose API has a field `kind` of its own: the spec spells it so (`kind` names the
# record), and it is sent as `kind`.
OWN_KINDS = {"lifecycle_kind": "lifecycle-job", "fleet_kind": "fleet"}


def read_spec(path: str) -> tuple[Kind, dict]:
    """The kind the file names and the API body it makes; SpecError naming the key."""
    source = Path(path)
    try:
        documents = [d for d in yaml.safe_load_all(source.read_text()) if d is not None]
    except OSError as error:
        raise SpecError(f"{path}: {error.strerror or error}") from error
    except yaml.YAMLError as error:
        raise SpecError(f"{path} is not valid YAML: {error}") from error
    if len(documents) != 1 or not isinstance(documents[0], dict):
        raise SpecError(f"{path}: one YAML mapping with a `kind` is expected.")
    body = dict(documents[0])
    named = body.pop("kind", None)
    if not isinstance(named, str):
        raise SpecError(f"{path}: `kind` is required: one of {', '.join(_applied())}.")
    try:
        kind = kind_named(named)
    except click.BadParameter:
        kind = None
    if kind is None or not kind.applied:
        raise SpecError(f"{path}: `kind: {named}` is not one of {', '.join(_applied())}.")
    for own, owner in OWN_KINDS.items():  # the record's API `kind`, spelled apart in a spec
        if own in body:
            if kind.name != owner:
                raise SpecError(f"{path}: `{own}` is for a {owner} only.")
            body["kind"] = body.pop(own)
    script = body.get("script")
    if isinstance(script, dict):
        body["script"] = _script_file(source, script)
    if kind.name == "episode" and not isinstance(body.get("environment"), int):
        raise SpecError(f"{path}: an episode needs `environment`: the id of its environment.")
    return kind, body


def _script_file(spec: Path, script: dict) -> str:
    if set(script) != {"file"} or not isinstance(script["file"], str):
        raise SpecError(
            f"{spec}: `script` is the script's text, or `{{file: PATH}}` to read it from a file."
        )
    path = spec.parent / script["file"]
    try:
        return path.read_text()
    except OSError as error:
        raise SpecError(f"{spec}: `script.file` {path}: {error.strerror or error}") from error


def _applied() -> list[str]:
    return [kind.name for kind in KINDS if kind.applied]


def spec_lines(path: str) -> dict[str, int]:
    """The line of each key of a spec file, by the API's name for it (``retry.max_attempts``;
    a lifecycle job's ``lifecycle_kind`` is its ``kind``): where an error points. Empty when
    the file cannot be read again."""
    try:
        root = yaml.compose(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return {}
    found: dict[str, int] = {}

    def walk(node, prefix: str) -> None:
        if not isinstance(node, yaml.MappingNode):
            return
        for key, value in node.value:
            name = str(key.value)
            if not prefix and name == "kind":
                continue
            if not prefix and name in OWN_KINDS:
                name = "kind"
            dotted = f"{prefix}.{name}" if prefix else name
            found[dotted] = key.start_mark.line + 1
            walk(value, dotted)

    walk(root, "")
    return found


def spec_line(lines: dict[str, int], field: str) -> int | None:
    """The line of the field an API error names (``env.LR``, ``command[2]``), else of the
    nearest key above it that the file has."""
    parts = field.replace("[", ".[").split(".")
    while parts:
        line = lines.get(".".join(parts).replace(".[", "["))
        if line:
            return line
        parts.pop()
    return None
