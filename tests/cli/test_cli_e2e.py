"""The ``tuneplane`` command, installed in the venv as a user installs it, driving a live
console end to end: a real web server (pytest-django's), a real worker allocating, a real
gateway and agent running the job as a real process with a fake inventory. The job's script
comes from a file beside the spec, prints lines and exits 3; ``logs -f`` prints them as they
come and exits 3."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import token_of

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

TUNEPLANE = Path(sys.executable).parent / "tuneplane"


@pytest.fixture
def tuneplane_as(live_server, tmp_path):
    def run_as(user):
        env = {
            **os.environ,
            "TUNEPLANE_SERVER": live_server.url,
            "TUNEPLANE_TOKEN": token_of(user),
            "XDG_CONFIG_HOME": str(tmp_path / "config"),
        }

        def tuneplane(*args, timeout=90):
            return subprocess.run(
                [str(TUNEPLANE), *map(str, args)],
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )

        return tuneplane

    return run_as


def test_apply_then_logs_follow_to_the_members_exit_code_then_get_events_and_cancel(
    running_node, member, tuneplane_as, tmp_path
):
    node = running_node[0]
    tuneplane = tuneplane_as(member)
    (tmp_path / "hello.sh").write_text(
        "for i in 1 2 3 4; do echo line-$i; sleep 1; done\necho done >&2\nexit 3\n"
    )
    path = tmp_path / "hello.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "kind": "training-job",
                "project": "ml",
                "name": "hello",
                "cards": 1,
                "script": {"file": "hello.sh"},
            }
        )
    )
    applied = tuneplane("apply", "-f", path)
    assert applied.returncode == 0, applied.stderr
    first, placed = applied.stdout.splitlines()
    job_id = first.split()[1]
    assert first == f"training-job {job_id} admitted to Fleet gpu-lab"
    assert placed == f"runs on: {node.id}"

    followed = tuneplane("logs", "training-job", job_id, "-f", "--interval", "0.5")
    assert followed.stdout == "line-1\nline-2\nline-3\nline-4\ndone\n", followed.stderr
    assert followed.returncode == 3, followed.stderr

    shown = tuneplane("get", "training-job", job_id)
    assert shown.returncode == 0 and " failed " in shown.stdout
    events = tuneplane("events", "training-job", job_id)
    assert events.returncode == 0 and "trainingjob.failed" in events.stdout

    path.write_text(
        yaml.safe_dump(
            {
                "kind": "training-job",
                "project": "ml",
                "name": "long",
                "cards": 1,
                "script": "sleep 600",
            }
        )
    )
    long = tuneplane("apply", "-f", path)
    assert long.stdout.splitlines()[1] == f"runs on: {node.id}"  # its member runs
    long_id = long.stdout.split()[1]
    cancelled = tuneplane("cancel", "training-job", long_id)
    assert cancelled.returncode == 0 and cancelled.stdout.startswith(f"training-job {long_id}: ")
    stopped = tuneplane("logs", "training-jobs", long_id, "-f", "--interval", "0.5")
    assert stopped.returncode == 128 + 15, stopped  # stopped by SIGTERM (R10)
