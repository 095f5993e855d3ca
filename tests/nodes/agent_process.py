"""Run the real tuneplane-node CLI as a subprocess, as a machine would."""

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from tests.e2e.console import ROOT


def machine(tmp_path: Path, name: str = "gpu-01") -> dict:
    """A pretend machine: its own state dir and machine-id."""
    home = tmp_path / name
    home.mkdir(parents=True, exist_ok=True)
    (home / "machine-id").write_text(uuid.uuid4().hex + "\n")
    return {
        "TUNEPLANE_NODE_STATE_DIR": str(home / "state"),
        "TUNEPLANE_MACHINE_ID_FILE": str(home / "machine-id"),
    }


def inventory_file(tmp_path: Path, inventory: dict) -> str:
    path = tmp_path / f"inventory-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps(inventory))
    return str(path)


def agent(*args: str, env: dict, timeout: int = 60) -> subprocess.CompletedProcess:
    base = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DJANGO", "DATABASE", "TUNEPLANE"))
    }
    return subprocess.run(
        [sys.executable, "-m", "nodes.agent", *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
