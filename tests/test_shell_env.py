"""The tests ignore the shell's ``TUNEPLANE_*`` settings (issue 49): a developer who exported
``TUNEPLANE_HEARTBEAT_INTERVAL`` while trying the agent by hand still gets a green
``make quick``. tests/shell_env.py drops them before Django reads its settings."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from django.conf import settings

from tests import shell_env

ROOT = Path(settings.BASE_DIR)

# What a developer's shell may hold after trying the console, the agent and the CLI by hand.
AMBIENT = {
    "TUNEPLANE_HEARTBEAT_INTERVAL": "1",
    "TUNEPLANE_STOP_GRACE": "3",
    "TUNEPLANE_DEBUG": "1",
    "TUNEPLANE_MEMBER_PIDS": "7",
    "TUNEPLANE_NODE_STATE_DIR": "/nonexistent/node",
    "TUNEPLANE_TOKEN": "tpk_not-a-token",
}

INNER = """
import os

from django.conf import settings


def test_the_settings_are_the_codes_not_the_shells():
    assert settings.TUNEPLANE_HEARTBEAT_INTERVAL == 10
    assert settings.TUNEPLANE_STOP_GRACE == 30
    assert settings.DEBUG is False
    assert settings.TUNEPLANE_MEMBER_PIDS == 4096
    left = sorted(name for name in {names} if name in os.environ)
    assert not left, left  # nor does a process a test starts inherit them
    assert os.environ["TUNEPLANE_VAR_DIR"] == {var_dir!r}  # the harness's own: kept
    assert os.environ["TUNEPLANE_BENCH_PROBE"] == "7"
"""


def test_a_test_run_in_a_shell_with_tuneplane_settings_exported_reads_the_codes_defaults(
    tmp_path,
):
    """A pytest run of its own, started with the shell's settings exported: its settings are
    the code's defaults and its environment holds none of them. Without the scrub (pyproject's
    ``-p tests.shell_env``) the heartbeat there is 1 s and this fails."""
    var_dir = tmp_path / "var"
    var_dir.mkdir()
    inner = tmp_path / "test_inner.py"
    inner.write_text(
        textwrap.dedent(INNER).format(names=sorted(AMBIENT), var_dir=str(var_dir)),
    )
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PYTEST_", "DATABASE_URL", "REDIS_URL"))
    }
    env.update(AMBIENT, TUNEPLANE_VAR_DIR=str(var_dir), TUNEPLANE_BENCH_PROBE="7")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", str(inner), "-q", "-p", "no:xdist"]
        + ["-p", "no:playwright", "-p", "no:schemathesis", "-p", "no:randomly"]
        + ["--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "1 passed" in run.stdout


def test_the_scrub_drops_every_tuneplane_setting_but_the_harnesss_own():
    environ = {
        **AMBIENT,
        "TUNEPLANE_VAR_DIR": "/tmp/var",
        "TUNEPLANE_SLURM24_ROOT": "/var/cache/tuneplane/slurm-24.11",
        "TUNEPLANE_BENCH_STREAMS": "1000",
        "TUNEPLANEX": "not ours",
        "PATH": "/usr/bin",
    }
    assert shell_env.scrub(environ) == sorted(AMBIENT)
    assert environ == {
        "TUNEPLANE_VAR_DIR": "/tmp/var",
        "TUNEPLANE_SLURM24_ROOT": "/var/cache/tuneplane/slurm-24.11",
        "TUNEPLANE_BENCH_STREAMS": "1000",
        "TUNEPLANEX": "not ours",
        "PATH": "/usr/bin",
    }
    assert shell_env.scrub({}) == []
