"""A member that names an image runs under the same OCI runtime as every other (R18): the
node's container runtime (docker or podman) is only where images come from. The image's
filesystem is exported from it once per image id and kept under the agent's state dir; each
member's root is an overlay of it (read-only, ``nodev``, ``nosuid``) with nothing of the
image's own user, capabilities or network — the member gets its uid, its namespaces, its
seccomp filter and its network like any other, and the image's env, entrypoint and command.

Every step here runs as root: programs by absolute path, a fixed environment (R17). What an
image holds is a tenant's: its tar is read with tarfile's ``tar`` filter (nothing outside the
root, no absolute path, no set-uid bit), device files and FIFOs are left out.
"""

import contextlib
import json
import logging
import os
import shutil
import subprocess
import tarfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from . import launch, scratchfs

logger = logging.getLogger("tuneplane-node")

PULL_TIMEOUT = 1800.0
RUNTIME_TIMEOUT = 60.0
# What a script runs by inside an image: its /bin/bash where it has one, else its /bin/sh.
SCRIPT_RUNNER = 'if [ -x /bin/bash ]; then exec /bin/bash "$0"; fi; exec /bin/sh "$0"'
# The init every member has as PID 1, bound into an image's root: the static build, since an
# image has its own C library or none.
INIT_STATIC = "/usr/bin/tini-static"
INIT_AT = "/run/tuneplane/init"
TMP_POINTS = ("tmp", "var/tmp")
# The runtime's CLI reaches its daemon by the agent's own settings, never the member's env.
RUNTIME_ENV = ("DOCKER_HOST", "DOCKER_CONFIG", "CONTAINER_HOST", "XDG_RUNTIME_DIR", "HOME")


class ImageError(Exception):
    """The image could not be had: what the runtime said, for the member's detail."""


@dataclass(frozen=True)
class Image:
    id: str
    env: tuple[tuple[str, str], ...] = ()
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()


def config_of(inspected: dict) -> Image:
    """The parts of ``<runtime> image inspect`` a member runs by: its id, env, entrypoint
    and command (its user, ports and volumes are the image's wish, not the member's)."""
    config = inspected.get("Config") or {}
    env = []
    for line in config.get("Env") or []:
        key, sep, value = str(line).partition("=")
        if sep and key:
            env.append((key, value))
    image_id = str(inspected.get("Id") or "")
    digest = image_id.removeprefix("sha256:")
    if not digest or not all(c in "0123456789abcdef" for c in digest):
        raise ImageError(f"the runtime named no image id ({image_id!r})")
    return Image(
        id=digest,
        env=tuple(env),
        entrypoint=tuple(str(a) for a in config.get("Entrypoint") or ()),
        cmd=tuple(str(a) for a in config.get("Cmd") or ()),
    )


def argv_of(image: Image, argv, script_at: str | None) -> list[str]:
    """What runs, as the runtime's ``run`` would: the image's entrypoint with the member's
    argv, or the image's command where it gives none; a script by the image's own shell."""
    if script_at:
        return ["/bin/sh", "-c", SCRIPT_RUNNER, script_at]
    found = [*image.entrypoint, *(argv or image.cmd)]
    if not found:
        raise ImageError("the image names no command and the member gives none")
    return found


def env_of(image: Image, own: dict, home: str) -> dict:
    """The image's env (with the system's PATH where it names none, as the runtime's ``run``
    gives), its scratch dir as HOME, then the member's own over both (R4). Only the member's
    own process ever runs with it (R17)."""
    return {"PATH": launch.SYSTEM_PATH, **dict(image.env), "HOME": home, **own}


def runtime_env() -> dict:
    env = {key: os.environ[key] for key in RUNTIME_ENV if key in os.environ}
    return {**env, "PATH": launch.SYSTEM_PATH, "LC_ALL": "C"}


def _cli(runtime: str) -> str:
    found = shutil.which(runtime, path=launch.SYSTEM_PATH)
    if not found:
        raise ImageError(f"no {runtime} on this node")
    return found


def _run(argv: list[str], timeout: float = RUNTIME_TIMEOUT, **options):
    try:
        return subprocess.run(
            argv, capture_output=True, env=runtime_env(), timeout=timeout, check=False, **options
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ImageError(f"{Path(argv[0]).name} {argv[1]}: {error}") from error


def _said(done) -> str:
    text = done.stderr.decode(errors="replace") if isinstance(done.stderr, bytes) else done.stderr
    return (text or "").strip().splitlines()[-1][:300] if (text or "").strip() else "failed"


def inspect(runtime: str, ref: str) -> Image | None:
    done = _run([_cli(runtime), "image", "inspect", "--format", "{{json .}}", ref], text=True)
    if done.returncode != 0:
        return None
    try:
        return config_of(json.loads(done.stdout))
    except ValueError as error:
        raise ImageError(f"the runtime's answer for {ref}: {error}") from error


def pull(runtime: str, ref: str) -> None:
    done = _run([_cli(runtime), "pull", "--quiet", ref], timeout=PULL_TIMEOUT, text=True)
    if done.returncode != 0:
        raise ImageError(f"{runtime} pull {ref}: {_said(done)}")


def resolve(runtime: str, ref: str, always_pull: bool) -> Image:
    """The image, pulled when the member asks (``pull: always``: the registry says whether
    the project may run it) or when the node does not have it."""
    if ref.startswith("-"):
        raise ImageError(f"not an image reference: {ref!r}")
    found = None if always_pull else inspect(runtime, ref)
    if found is None:
        pull(runtime, ref)
        found = inspect(runtime, ref)
    if found is None:
        raise ImageError(f"{runtime} has no image {ref}")
    return found


def _kept(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """tarfile's ``tar`` filter, and no device file or FIFO: a root made of an image holds
    files, dirs and links only."""
    if member.ischr() or member.isblk() or member.isfifo():
        return None
    return tarfile.tar_filter(member, dest)


def root_of(runtime: str, image: Image, cache: Path) -> Path:
    """The image's filesystem under ``cache/<id>``, exported once and kept: a container
    created (never started) from it, its export read into a dir of its own, renamed in."""
    root = cache / image.id
    if root.is_dir():
        return root
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    part = cache / f".{image.id}.{uuid.uuid4().hex[:8]}"
    cli = _cli(runtime)
    created = _run([cli, "create", image.id, "/tuneplane-export"], text=True)
    if created.returncode != 0:
        raise ImageError(f"{runtime} create: {_said(created)}")
    container = created.stdout.strip()
    try:
        part.mkdir(mode=0o755)
        export = subprocess.Popen(
            [cli, "export", container],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=runtime_env(),
        )
        with export, tarfile.open(fileobj=export.stdout, mode="r|") as tar:
            tar.extractall(part, numeric_owner=True, filter=_kept)
        if export.returncode != 0:
            raise ImageError(f"{runtime} export ended {export.returncode}")
        try:
            part.rename(root)
        except OSError:  # another start of the same image got there first
            if not root.is_dir():
                raise
    except (OSError, tarfile.TarError) as error:
        raise ImageError(f"the image's filesystem: {error}") from error
    finally:
        _run([cli, "rm", "--force", container])
        if part.exists():
            shutil.rmtree(part, ignore_errors=True)
    return root


def mount_root(lower: Path, bundle: Path) -> None:
    """The member's root: an overlay of the image's filesystem (never written: what the
    runtime makes in it lands in the bundle's ``upper``), mounted read-only by the bundle."""
    upper, work, rootfs = bundle / "upper", bundle / "work", bundle / "rootfs"
    for path in (upper, work, rootfs):
        path.mkdir(mode=0o755, exist_ok=True)
    # Its private /tmp and /var/tmp are tmpfs the runtime gives their mount point's mode: a
    # 1777 point in the upper layer (the agent's own dir; what the image has there, a dir, a
    # link or nothing, is hidden by it, never followed).
    for name in TMP_POINTS:
        (upper / name).mkdir(parents=True, exist_ok=True)
        os.chmod(upper / name, 0o1777)
    options = f"lowerdir={lower},upperdir={upper},workdir={work}"
    argv = [scratchfs.tool(scratchfs.MOUNT), "--no-canonicalize", "-t", "overlay", "overlay"]
    try:
        scratchfs.run_tool([*argv, "-o", f"nodev,nosuid,{options}", str(rootfs)], "mount")
    except OSError as error:
        raise ImageError(f"the image's overlay: {error.strerror or error}") from error


def unmount_root(bundle: Path) -> bool:
    """The member's overlay root unmounted (lazily when busy): whether none is left."""
    rootfs = bundle / "rootfs"
    for lazy in (False, True):
        if not os.path.ismount(rootfs):
            return True
        with contextlib.suppress(OSError):
            argv = scratchfs.unmount_argv(scratchfs.tool(scratchfs.UMOUNT), rootfs, lazy)
            scratchfs.run_tool(argv, "umount", check=False)
    return not os.path.ismount(rootfs)
