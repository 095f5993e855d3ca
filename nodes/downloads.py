"""The agent's wheel and its dependencies, served by the console so machines need no index."""

import shutil
import subprocess
import sys
from pathlib import Path

from django.conf import settings

AGENT_SOURCE = Path(__file__).resolve().parent / "agent"


def downloads_dir() -> Path:
    return Path(settings.TUNEPLANE_DOWNLOADS_DIR)


def wheels() -> list[Path]:
    directory = downloads_dir()
    return sorted(directory.glob("*.whl")) if directory.is_dir() else []


def agent_wheel_present() -> bool:
    return any(path.name.startswith("tuneplane_node-") for path in wheels())


def build_agent_wheels() -> subprocess.CompletedProcess:
    """``pip wheel`` the agent and everything it installs into the downloads directory."""
    downloads_dir().mkdir(parents=True, exist_ok=True)
    try:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--disable-pip-version-check",
                "--no-build-isolation",
                "--wheel-dir",
                str(downloads_dir()),
                str(AGENT_SOURCE),
            ],
            capture_output=True,
            text=True,
        )
    finally:
        # setuptools builds in the source tree; leave it as it was.
        shutil.rmtree(AGENT_SOURCE / "build", ignore_errors=True)
        shutil.rmtree(AGENT_SOURCE / "tuneplane_node.egg-info", ignore_errors=True)
