"""Never a silent skip (a pytest plugin, loaded by tests/conftest.py): a test that needs a
part this machine lacks (Chromium, Slurm, the OpenAPI client generator) is skipped, and the
run's last line names each missing part and the command that installs it. In CI
(``CI`` set) such a test fails instead. No Django here, so that it is tested on its own."""

import os

import pytest

# The words that mark a skip for a part this machine lacks; the run's last line lists them.
MISSING = "is not installed here"


def skip_missing(part: str, install: str) -> None:
    """A test needing a part this machine lacks (Chromium, Slurm) is skipped, and said so in
    one line at the end of the run with what installs it; in CI it fails instead."""
    reason = f"{part} {MISSING} (install: {install})"
    if os.environ.get("CI"):
        pytest.fail(f"{reason}: required in CI")
    pytest.skip(reason)


def pytest_terminal_summary(terminalreporter, config):
    """Never a silent skip: the parts this machine lacks, counted for the run's last line."""
    skipped: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
        if MISSING in reason:
            reason = reason.removeprefix("Skipped: ")
            skipped[reason] = skipped.get(reason, 0) + 1
    config.missing_parts = skipped


def pytest_unconfigure(config):
    """After pytest's own last line: one line naming each missing part and what installs it."""
    skipped = getattr(config, "missing_parts", None)
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    if skipped and terminal is not None:
        terminal.write_line(
            "skipped, as this machine lacks them: "
            + "; ".join(f"{count} test(s): {reason}" for reason, count in skipped.items()),
            yellow=True,
            bold=True,
        )
