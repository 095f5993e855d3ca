"""The OpenAPI document a client generator and Swagger can use: valid with no warning from
drf-spectacular, the Bearer token as a security scheme on every operation, enum components
named for what they are; and a Python client generated from it (openapi-python-client,
pinned in tools/openapi-client.txt) lists a Fleet against a live server."""

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from django.core.management import call_command

from tests.conftest import SYSTEM
from tests.missing_parts import skip_missing
from tuneplane.services import api_token_create

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / ".venv-tools" / "bin" / "openapi-python-client"
# Operations a caller reaches without an API token: the join token is the authorization.
WITHOUT_TOKEN = {("/api/nodes/join", "post")}


@pytest.fixture(scope="module")
def schema(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("schema") / "schema.json"
    # --fail-on-warn: an unresolved authenticator, a colliding enum, a field of unknown
    # type each fail here, naming the view.
    call_command(
        "spectacular", "--validate", "--fail-on-warn", "--format=openapi-json", f"--file={path}"
    )
    return json.loads(path.read_text())


def test_the_document_validates_with_no_warning(schema):
    assert schema["openapi"].startswith("3.") and len(schema["paths"]) >= 20


def test_every_operation_takes_the_bearer_token(schema):
    assert schema["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "An API token: `Authorization: Bearer <token>`.",
    }
    without = {
        (path, method)
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
        if {"bearerAuth": []} not in operation.get("security", [])
    }
    assert without == WITHOUT_TOKEN


def test_enum_components_say_what_they_are(schema):
    enums = {name for name in schema["components"]["schemas"] if name.endswith("Enum")}
    hashed = {name for name in enums if re.search(r"[0-9a-f]{3}Enum$", name)}
    assert not hashed, f"named by a hash, not by what they are: {sorted(hashed)}"
    assert {"FleetKindEnum", "FleetStateEnum", "LifecycleKindEnum", "CommandKindEnum"} <= enums


@pytest.mark.e2e
def test_a_generated_python_client_lists_a_fleet_against_a_live_server(
    live_server, admin_user, make_fleet, tmp_path, monkeypatch
):
    if not GENERATOR.exists():
        skip_missing("openapi-python-client", "make install")
    make_fleet("gpu-lab", kind="node", capabilities=["train"])
    _, token = api_token_create(actor=SYSTEM, user=admin_user)
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    served = httpx.get(f"{live_server.url}/api/schema", params={"format": "json"})
    (tmp_path / "schema.json").write_bytes(served.raise_for_status().content)
    (tmp_path / "config.yaml").write_text("post_hooks: []\n")
    generated = subprocess.run(
        [GENERATOR, "generate", "--path", "schema.json", "--meta", "none", "--config",
         "config.yaml", "--output-path", "tuneplane_client"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PATH": f"{GENERATOR.parent}:{os.environ['PATH']}"},
    )  # fmt: skip
    assert generated.returncode == 0 and "Warning" not in generated.stdout, generated.stdout
    monkeypatch.syspath_prepend(str(tmp_path))
    client_module = importlib.import_module("tuneplane_client")
    fleets_list = importlib.import_module("tuneplane_client.api.fleets.fleets_list")
    kinds = importlib.import_module("tuneplane_client.models.fleet_kind_enum")
    client = client_module.AuthenticatedClient(base_url=live_server.url, token=token)
    page = fleets_list.sync(client=client)
    assert page.count == 1
    (fleet,) = page.results
    assert (fleet.id, fleet.kind, fleet.state.value) == (
        "gpu-lab",
        kinds.FleetKindEnum.NODE,
        "active",
    )
    anonymous = client_module.Client(base_url=live_server.url)
    assert fleets_list.sync_detailed(client=anonymous).status_code == 401
    for name in [module for module in sys.modules if module.startswith("tuneplane_client")]:
        monkeypatch.delitem(sys.modules, name)
