"""A Docker daemon of the test session's own, with a small local image (no registry here).

Debian's dockerd (``apt-get install docker.io``) is started by hand — no systemd on these
machines — on a socket, exec root and pid file unique to the session (several suites may run
at once on one machine), with a data root kept under /var/cache so the imported image
outlives the run. The image is busybox-static's binary and its applets in an otherwise
empty root filesystem, imported as ``IMAGE``. Members reach the daemon through
``DOCKER_HOST``, which the fixture sets for the session. Without dockerd a test that needs
it is skipped with what installs it (tests/missing_parts.py), and fails in CI.
"""

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.missing_parts import skip_missing

IMAGE = "tuneplane-test/busybox:1"
DOCKERD = "/usr/sbin/dockerd"
BUSYBOX = "/bin/busybox"
READY_TIMEOUT = 30.0
START_ATTEMPTS = 3
DATA_ROOTS = "/var/cache/tuneplane"


def _docker(host: str, *args: str, **options) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", *args],
        env={**os.environ, "DOCKER_HOST": host},
        capture_output=True,
        timeout=120,
        **options,
    )


def _ready(host: str) -> bool:
    try:
        return _docker(host, "info", "--format", "{{.ServerVersion}}").returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _import_image(host: str) -> None:
    if _docker(host, "image", "inspect", IMAGE).returncode == 0:
        return
    with tempfile.TemporaryDirectory(prefix="tp-busybox-") as root:
        (Path(root) / "bin").mkdir()
        shutil.copy(BUSYBOX, Path(root) / "bin" / "busybox")
        applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True).stdout
        for applet in applets.split():
            link = Path(root) / "bin" / applet
            if not link.exists():
                link.symlink_to("busybox")
        for directory in ("tmp", "etc", "proc", "sys", "dev"):
            (Path(root) / directory).mkdir()
        tar = subprocess.run(["tar", "-C", root, "-c", "."], capture_output=True, check=True)
        done = _docker(
            host, "import", "-c", "ENV PATH=/bin", "-", IMAGE, input=tar.stdout, check=False
        )
        assert done.returncode == 0, done.stderr


def _end_leftovers(data: Path) -> None:
    """A daemon an earlier run left on this data root (that run killed before it could stop
    it; the lock it held went with it) still holds its store, and a new daemon's containerd
    would wait on it until it times out: ended, with what it started (its process group)."""
    ended = False
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:1] == [DOCKERD.encode()] and str(data).encode() in argv:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(entry.name), signal.SIGKILL)
                ended = True
    if ended:
        time.sleep(1.0)  # its store's lock goes with its processes


def _data_root():
    """A data root no other running session uses (dockerd locks its own), kept for the next
    run's image: the first of a few whose lock file this process can take."""
    Path(DATA_ROOTS).mkdir(parents=True, exist_ok=True)
    for number in range(64):
        lock = open(f"{DATA_ROOTS}/docker-{number}.lock", "w")  # noqa: SIM115 -- held till the end
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        data = Path(f"{DATA_ROOTS}/docker-{number}")
        _end_leftovers(data)
        return lock, data
    raise AssertionError(f"every data root under {DATA_ROOTS} is in use")


def _start(host: str, data: Path, run: Path, log) -> subprocess.Popen:
    return subprocess.Popen(
        [
            DOCKERD,
            "-H",
            host,
            "--data-root",
            str(data),
            "--exec-root",
            str(run / "exec"),
            "--pidfile",
            str(run / "dockerd.pid"),
            "--iptables=false",
            "--ip6tables=false",
            "--bridge=none",
            "--storage-driver=overlay2",
            "--exec-opt",
            "native.cgroupdriver=cgroupfs",
        ],
        stdout=log,
        stderr=log,
        start_new_session=True,
    )


def _stop(daemon: subprocess.Popen) -> None:
    daemon.terminate()
    try:
        daemon.wait(timeout=60)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait()


@contextlib.contextmanager
def running_dockerd():
    """A dockerd of this session's own: its DOCKER_HOST, the image imported."""
    for part, path, install in (
        ("Docker", DOCKERD, "apt-get install docker.io"),
        ("busybox", BUSYBOX, "apt-get install busybox-static"),
    ):
        if not os.path.exists(path) or not shutil.which("docker"):
            skip_missing(part, install)
    run = Path(tempfile.mkdtemp(prefix="tp-dockerd-", dir="/tmp"))
    lock, data = _data_root()
    host = f"unix://{run}/docker.sock"
    log = open(run / "dockerd.log", "ab")  # noqa: SIM115 -- dockerd's, closed at the end
    daemon = None
    try:
        # Under load its containerd may not answer dockerd in time, and dockerd exits: a
        # daemon that did not start is started again, twice, before the tests are told.
        for attempt in range(START_ATTEMPTS):
            if attempt:  # what the daemon that did not start left
                (run / "dockerd.pid").unlink(missing_ok=True)
                subprocess.run(
                    ["umount", str(run / "exec" / "netns" / "default")],
                    check=False,
                    capture_output=True,
                )
            daemon = _start(host, data, run, log)
            deadline = time.monotonic() + READY_TIMEOUT
            while not _ready(host) and daemon.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            if _ready(host):
                break
            _stop(daemon)
            if attempt + 1 == START_ATTEMPTS:
                message = (run / "dockerd.log").read_text()[-2000:]
                if os.environ.get("CI"):
                    pytest.fail(f"dockerd did not start: {message}")
                pytest.skip(f"dockerd did not start here: {message}")
        _import_image(host)
        yield host
    finally:
        # Whatever a test left: removed before the daemon goes, so no container outlives it.
        left = []
        if daemon is not None and daemon.poll() is None:
            left = _docker(host, "ps", "-aq", "--filter", "label=tuneplane.member").stdout.split()
        if left:
            _docker(host, "rm", "-f", *[item.decode() for item in left])
        if daemon is not None:
            _stop(daemon)
        log.close()
        lock.close()
        subprocess.run(["umount", str(run / "exec" / "netns" / "default")], capture_output=True)
        shutil.rmtree(run, ignore_errors=True)


@pytest.fixture(scope="session")
def dockerd():
    """DOCKER_HOST of the session's own dockerd, set in this process's environment too (the
    agent's runtime client and what it starts read it)."""
    with running_dockerd() as host:
        before = os.environ.get("DOCKER_HOST")
        os.environ["DOCKER_HOST"] = host
        try:
            yield host
        finally:
            if before is None:
                os.environ.pop("DOCKER_HOST", None)
            else:
                os.environ["DOCKER_HOST"] = before


def unique_scope() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"
