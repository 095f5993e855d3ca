"""Running a confined member under the OCI runtime (R18): where its bundle and the runtime's
state live in the agent's state dir, the keeper's argv, and the runtime's ``delete``.

Every step here runs as root, so each names its program by absolute path and runs it with a
fixed environment (R17): nothing of a member's env, and no file in a place a member can write.
"""

import contextlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from . import bundle, images, launch

logger = logging.getLogger("tuneplane-node")

# The runtimes a node may have, in the order they are taken: both read the same bundle.
RUNTIMES = ("/usr/bin/runc", "/usr/sbin/runc", "/usr/bin/crun")
FIXED_ENV = {"PATH": launch.SYSTEM_PATH, "LANG": "C.UTF-8"}
RUNTIME_TIMEOUT = 30.0


def runtime() -> str:
    """The runtime's absolute path, or "" when the node has none."""
    return next((path for path in RUNTIMES if os.access(path, os.X_OK)), "")


def unavailable() -> str:
    """Why members cannot run under the runtime here ("" when they can)."""
    if os.geteuid() != 0:
        return "the agent is not root"
    missing = []
    if not runtime():
        missing.append("runc or crun")
    if not os.access(bundle.INIT, os.X_OK):
        missing.append(f"tini ({bundle.INIT})")
    if not bundle.SECCOMP_PROFILE.is_file():
        missing.append(f"the seccomp profile ({bundle.SECCOMP_PROFILE}, containers-common)")
    return f"no {', '.join(missing)} on this node" if missing else ""


class Paths:
    """A runner's places for its members' bundles and for the runtime's own state (root's,
    0700: a member's config names its env)."""

    def __init__(self, root: Path):
        self.bundles = root / "bundles"
        self.state = root / "runtime"
        # Images' filesystems, one per image id, kept: the lower layer of image members' roots.
        self.images = root / "images"

    def bundle(self, member_id: str) -> Path:
        return self.bundles / member_id

    def ensure(self) -> None:
        for path in (self.bundles, self.state):
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(path, 0o700)


# The keeper is the agent's interpreter, isolated (``-I``: no PYTHON* variable, no user site,
# no current dir) and without ``site`` (``-S``: no .pth file runs; a member's start waits on
# the keeper's). It imports from the dir the agent's own package is in, root's.
PACKAGE_ROOT = Path(__file__).resolve().parents[3]
KEEPER_BOOT = (
    "import sys; sys.path.insert(0, {root!r}); "
    "from {module} import main; raise SystemExit(main(sys.argv[1:]))"
)


# The word the keeper waits for on its pipe before it runs the member.
GO = b"1"


def keeper_argv(
    paths: Paths,
    member_id: str,
    exit_file: Path,
    log_file: Path,
    log_cap: int | None,
    go_fd: int | None = None,
) -> list[str]:
    """The keeper (shim.py) that starts the member and carries its output."""
    return [
        sys.executable,
        "-I",
        "-S",
        "-c",
        KEEPER_BOOT.format(root=str(PACKAGE_ROOT), module=f"{__package__}.shim"),
        runtime(),
        str(paths.state),
        str(paths.bundle(member_id)),
        member_id,
        str(exit_file),
        str(log_file),
        str(log_cap or 0),
        *([] if go_fd is None else [str(go_fd)]),
    ]


def delete(paths: Paths, member_id: str) -> bool:
    """The runtime's record of the member removed, its processes killed first (``delete
    --force``), and its bundle with it; whether nothing of it is left in the runtime's state."""
    found = runtime()
    if found and (paths.state / member_id).exists():
        try:
            subprocess.run(
                [found, "--root", str(paths.state), "delete", "--force", member_id],
                capture_output=True,
                env=FIXED_ENV,
                timeout=RUNTIME_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            logger.warning("member %s: the runtime's delete: %s", member_id, error)
    gone = not (paths.state / member_id).exists()
    # An image member's root is an overlay mounted in its bundle: unmounted before the
    # bundle goes, never removed through.
    gone = gone and images.unmount_root(paths.bundle(member_id))
    if gone:
        with contextlib.suppress(OSError):
            shutil.rmtree(paths.bundle(member_id))
    return gone
