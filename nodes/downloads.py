"""The agent's wheel and its dependencies, served by the console so machines need no index."""

import hashlib
import re
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


# pip's hash-checking requirements for every wheel served: what install.sh installs, and
# the digest of this text is what the one-liner carries (TUNEPLANE_AGENT_SHA256).
LOCK_NAME = "tuneplane-node.lock"
_WHEEL_NAME = re.compile(
    r"^(?P<dist>[^-]+)-(?P<version>[^-]+)(?:-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$"
)
_digests: dict[tuple[str, int, int], str] = {}  # (path, size, mtime) → SHA-256


def _sha256(path: Path) -> str:
    status = path.stat()
    key = (str(path), status.st_size, status.st_mtime_ns)
    if key not in _digests:
        digest = hashlib.sha256()
        with path.open("rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                digest.update(block)
        _digests[key] = digest.hexdigest()
    return _digests[key]


def lock_text() -> str:
    """``name==version --hash=sha256:…`` for each wheel served, for ``pip install
    --require-hashes``: a wheel changed after the one-liner was shown does not install."""
    pinned: dict[tuple[str, str], list[str]] = {}
    for path in wheels():
        named = _WHEEL_NAME.match(path.name)
        if named:
            pinned.setdefault((named["dist"], named["version"]), []).append(_sha256(path))
    return "".join(
        f"{dist}=={version} " + " ".join(f"--hash=sha256:{d}" for d in sorted(digests)) + "\n"
        for (dist, version), digests in sorted(pinned.items())
    )


def lock_sha256() -> str:
    return hashlib.sha256(lock_text().encode()).hexdigest()


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
