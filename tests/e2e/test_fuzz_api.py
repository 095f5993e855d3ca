"""The API fuzzed against its own OpenAPI document (schemathesis), as an administrator and
as a plain member: no server error, no response the document does not describe.

The web runs as production runs it (gunicorn) on the test database, with a project, a node
Fleet and a project Fleet the member cannot see, so that generated requests meet real rows
as well as missing ones. Seeds are fixed: a failure reproduces with the same command.
"""

import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from audit.services import Actor
from tests.e2e.console import ROOT, console_env, free_port
from tuneplane.services import api_token_create

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
    ]
)
MIN_CASES = 1000
SCHEMATHESIS = str(Path(sys.executable).with_name("schemathesis"))


@pytest.fixture
def web(tmp_path):
    """gunicorn serving the console on the test database; its log, for server tracebacks."""
    port, log = free_port(), tmp_path / "web.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "tuneplane.wsgi",
                "-b",
                f"127.0.0.1:{port}",
                "-w",
                "2",
                "--limit-request-line",
                "8190",
            ],
            env=console_env(tmp_path, TUNEPLANE_DEBUG="0", TUNEPLANE_SECRET_KEY="fuzz-" * 10),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not _answers(url):
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    yield url, log
    process.terminate()
    process.wait(10)


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(f"{url}/healthz", timeout=1)
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


@pytest.fixture
def people(admin_user, member, project, make_fleet):
    from tuneplane.models import Project

    admin_user.is_superuser = True
    admin_user.save(update_fields=["is_superuser"])
    make_fleet("gpu-lab", kind="node", capabilities=["train", "serve", "env"])
    secret = Project.objects.create(slug="secret", name="Secret")
    make_fleet("hidden", kind="node", capabilities=["train"], visibility="project", project=secret)
    return {
        "admin": api_token_create(actor=Actor.of_user(admin_user), user=admin_user)[1],
        "member": api_token_create(actor=Actor.of_user(member), user=member)[1],
    }


@pytest.mark.parametrize("who, seed", [("admin", 1), ("member", 2)])
def test_the_api_keeps_its_openapi_document_under_fuzzing(web, people, who, seed, tmp_path):
    url, log = web
    result = subprocess.run(
        [
            SCHEMATHESIS,
            "run",
            f"{url}/api/schema",
            "-H",
            f"Authorization: Bearer {people[who]}",
            "-c",
            CHECKS,
            "-n",
            "20",
            "--seed",
            str(seed),
            "--no-color",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    summary = re.search(r"(\d+) generated", result.stdout)
    tracebacks = "\n".join(
        re.findall(r"Traceback.*?(?=\n\S+ \S+ \S+ \S+|\Z)", log.read_text(), re.S)
    )[-4000:]
    assert result.returncode == 0, result.stdout[-6000:] + "\n--- server ---\n" + tracebacks
    assert summary and int(summary.group(1)) >= MIN_CASES, result.stdout[-2000:]
