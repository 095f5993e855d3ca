"""A replayed Kubernetes object checked against the schema of the Kubernetes API the official
client ships (its generated models, kubernetes 36 = Kubernetes 1.36): every field one the
API has, under its JSON name, of its type; every field the API requires present; quantities
and condition statuses as an API server writes them. A fixture a real server would never send
is named, with its path, by ``violations``."""

import datetime
import re

from kubernetes import client

# resource.Quantity's serialized form (the API's canonical string, never a JSON number).
QUANTITY = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
QUANTITY_MAPS = {"V1NodeStatus": ("capacity", "allocatable")}
CONDITION_STATUSES = {"True", "False", "Unknown"}
PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}


def violations(data, model: str, path: str = "") -> list[str]:
    """What in ``data`` (decoded JSON) the API's ``model`` (e.g. "V1NodeList") does not allow,
    one line each, by path."""
    found = []
    if model.startswith("list["):
        if not isinstance(data, list):
            return [f"{path}: a list expected, got {type(data).__name__}"]
        for i, item in enumerate(data):
            found += violations(item, model[5:-1], f"{path}[{i}]")
        return found
    if model.startswith("dict["):
        if not isinstance(data, dict):
            return [f"{path}: an object expected, got {type(data).__name__}"]
        value_model = model[5:-1].split(", ", 1)[1]
        for key, value in data.items():
            found += violations(value, value_model, f"{path}.{key}")
        return found
    if model in PRIMITIVES:
        wanted = PRIMITIVES[model]
        # JSON has no int/bool split in Python: True is an int, never the reverse here.
        wrong = not isinstance(data, wanted) or (model == "int" and isinstance(data, bool))
        return [f"{path}: {model} expected, got {data!r}"] if wrong else []
    if model == "datetime":
        try:
            datetime.datetime.fromisoformat(str(data).replace("Z", "+00:00"))
        except ValueError:
            return [f"{path}: an RFC 3339 time expected, got {data!r}"]
        return []
    cls = getattr(client, model)
    if not isinstance(data, dict):
        return [f"{path}: {model} (an object) expected, got {type(data).__name__}"]
    by_json = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    for key, value in data.items():
        if key not in by_json:
            found.append(f"{path}.{key}: no such field in {model}")
        elif value is not None:
            found += violations(value, cls.openapi_types[by_json[key]], f"{path}.{key}")
    for field in QUANTITY_MAPS.get(model, ()):
        for name, quantity in (data.get(field) or {}).items():
            if not isinstance(quantity, str) or not QUANTITY.match(quantity):
                found.append(f"{path}.{field}.{name}: a quantity string expected, got {quantity!r}")
    if model == "V1NodeCondition" and data.get("status") not in CONDITION_STATUSES:
        found.append(
            f"{path}.status: one of {sorted(CONDITION_STATUSES)}, got {data.get('status')!r}"
        )
    if not found:
        found += _required(data, cls, path)
    return found


def _required(data: dict, cls, path: str) -> list[str]:
    """The fields the model's own constructor refuses to be without (the client's
    client-side validation of required fields)."""
    kwargs = {attr: data.get(json_name) for attr, json_name in cls.attribute_map.items()}
    try:
        cls(**{attr: value for attr, value in kwargs.items() if value is not None})
    except ValueError as error:
        return [f"{path}: {error}"]
    return []
