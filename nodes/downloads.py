"""The agent's wheel and its dependencies, served by the console so machines need no index;
and beside them the ``tuneplane`` command line's wheel (cli/), with its SHA-256, for the
people who submit work (its dependencies come from their own index)."""

import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

from django.conf import settings

AGENT_SOURCE = Path(__file__).resolve().parent / "agent"
CLI_SOURCE = Path(__file__).resolve().parent.parent / "cli"
CLI_DIST = "tuneplane_cli"
# ``sha256sum -c`` reads it: the CLI wheel's digest and name.
CLI_DIGEST_NAME = "tuneplane-cli.sha256"


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
        if named and named["dist"] != CLI_DIST:  # the CLI is no part of a node's install
            pinned.setdefault((named["dist"], named["version"]), []).append(_sha256(path))
    return "".join(
        f"{dist}=={version} " + " ".join(f"--hash=sha256:{d}" for d in sorted(digests)) + "\n"
        for (dist, version), digests in sorted(pinned.items())
    )


def lock_sha256() -> str:
    return hashlib.sha256(lock_text().encode()).hexdigest()


def sha256_of(path: Path) -> str:
    return _sha256(path)


def agent_wheel_present() -> bool:
    return any(path.name.startswith("tuneplane_node-") for path in wheels())


def cli_wheel() -> Path | None:
    """The newest CLI wheel served (by name: one version is built at a time)."""
    found = [path for path in wheels() if path.name.startswith(f"{CLI_DIST}-")]
    return found[-1] if found else None


def cli_digest_text() -> str:
    """``<sha256>  <wheel>`` for the CLI wheel served, as ``sha256sum`` writes it; "" if none."""
    wheel = cli_wheel()
    return f"{_sha256(wheel)}  {wheel.name}\n" if wheel else ""


def build_cli_wheel() -> subprocess.CompletedProcess:
    """``pip wheel`` the CLI alone into the downloads directory (no dependencies: a person's
    machine installs those from its own index)."""
    return _pip_wheel(CLI_SOURCE, "--no-deps")  # its egg-info is the dev venv's editable install


def build_agent_wheels() -> subprocess.CompletedProcess:
    """``pip wheel`` the agent and everything it installs into the downloads directory."""
    return _pip_wheel(AGENT_SOURCE, leftover="tuneplane_node.egg-info")


def _pip_wheel(source: Path, *options: str, leftover: str = "") -> subprocess.CompletedProcess:
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
                *options,
                "--wheel-dir",
                str(downloads_dir()),
                str(source),
            ],
            capture_output=True,
            text=True,
        )
    finally:
        # setuptools builds in the source tree; leave it as it was.
        shutil.rmtree(source / "build", ignore_errors=True)
        if leftover:
            shutil.rmtree(source / leftover, ignore_errors=True)
