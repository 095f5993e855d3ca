"""`make test` on a machine without Chromium or Slurm: never a silent skip. The run's last
line names what was skipped and the command that installs it; in CI the test fails."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NEEDS_A_PART = """
from tests.missing_parts import skip_missing


def test_needs_chromium():
    skip_missing("Chromium", "apt-get install chromium")


def test_needs_slurm():
    skip_missing("Slurm", "apt-get install slurm-wlm slurmrestd munge")


def test_needs_nothing():
    pass
"""


def run(tmp_path, **env) -> subprocess.CompletedProcess:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_parts.py").write_text(NEEDS_A_PART)
    environment = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.missing_parts", "-p", "no:django",
         "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "test_parts.py"],
        cwd=tmp_path, env={**environment, "PYTHONPATH": str(ROOT), **env},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_missing_part_is_named_on_the_last_line_with_what_installs_it(tmp_path):
    result = run(tmp_path)
    assert result.returncode == 0, result.stdout
    assert result.stdout.strip().splitlines()[-1] == (
        "skipped, as this machine lacks them: "
        "1 test(s): Chromium is not installed here (install: apt-get install chromium); "
        "1 test(s): Slurm is not installed here "
        "(install: apt-get install slurm-wlm slurmrestd munge)"
    )


def test_in_ci_a_missing_part_fails(tmp_path):
    result = run(tmp_path, CI="true")
    assert result.returncode == 1 and "2 failed, 1 passed" in result.stdout
    assert "Chromium is not installed here (install: apt-get install chromium): required in CI" in (
        result.stdout
    )
