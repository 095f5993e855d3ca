"""The tests ignore the shell's own ``TUNEPLANE_*`` settings (issue 49).

A developer who tried the agent or the console by hand may have ``TUNEPLANE_HEARTBEAT_INTERVAL``,
``TUNEPLANE_NODE_STATE_DIR`` or ``TUNEPLANE_TOKEN`` exported; the tests set what they depend
on, so every such variable is dropped from the environment here — before Django reads its
settings, and before any process a test starts inherits the environment.

Loaded as a plugin by pyproject.toml's ``addopts`` (``-p tests.shell_env``): pytest imports
it before pytest-django loads the settings, which happens before any conftest.py is read, so
a conftest would be too late. What the harness itself sets or reads is kept: SCRUB_KEPT.
"""

import os

# Set by the Makefile (`make quick`, `test-sqlite`, `mutate`), or read by the tests
# themselves as knobs of the harness: never a setting of the console, the agent or the CLI.
SCRUB_KEPT = {"TUNEPLANE_VAR_DIR", "TUNEPLANE_SLURM24_ROOT", "TUNEPLANE_KUBE_ROOT"}
SCRUB_KEPT_PREFIXES = ("TUNEPLANE_BENCH_",)


def ambient(environ) -> list[str]:
    """The ``TUNEPLANE_*`` variables of ``environ`` that the tests do not keep."""
    return sorted(
        name
        for name in environ
        if name.startswith("TUNEPLANE_")
        and name not in SCRUB_KEPT
        and not name.startswith(SCRUB_KEPT_PREFIXES)
    )


def scrub(environ=os.environ) -> list[str]:
    """Drop the shell's ``TUNEPLANE_*`` settings from ``environ``; the names dropped."""
    dropped = ambient(environ)
    for name in dropped:
        del environ[name]
    return dropped


DROPPED = scrub()


def pytest_report_header(config):
    if DROPPED:
        return f"ignored from the shell (tests/shell_env.py): {', '.join(DROPPED)}"
    return None
