"""What a member's process is started with (R4): its argv, its env, its scratch dir and the
wrapper that confines it and records how it ended — everything named by the member's id, so
that a cleanup finds it even when the state file is gone (R7)."""

import os
import subprocess
from pathlib import Path

from ..wire import MemberSpec

# "$1" is the exit file, "$2" the cgroup.procs files to join (space-separated); the argv
# follows. The wrapper joins the cgroups, then runs the argv in the foreground with a TERM
# trap: a stop's SIGTERM to the process group reaches the member, while the wrapper (whose
# trap runs only once the member is gone, and which the member does not inherit) stays to
# write the exit code, atomically, for an agent that may have restarted since.
WRAPPER = (
    'exitfile=$1; procs=$2; shift 2; for f in $procs; do echo $$ > "$f" || '
    '{ echo 125 > "$exitfile.tmp"; mv "$exitfile.tmp" "$exitfile"; exit 125; }; done; '
    'trap : TERM; "$@"; code=$?; echo "$code" > "$exitfile.tmp" && mv "$exitfile.tmp" "$exitfile"'
)

# The PATH of what runs without the agent's environment: the runtime's CLI (R14), a
# confined member (R11).
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def member_env(
    spec: MemberSpec, scratch: Path, storage_root: str | None = None, confined: bool = False
) -> dict:
    """R4: exactly its cards, the job's env, its Fleet's delivery, a gang's rendezvous — over
    the agent's own environment less what names cards or the agent's settings; a member under
    a uid of its own (R11) gets none of the agent's environment, only a fixed base (a PATH
    of the system's dirs, its scratch dir as HOME, the agent's locale and time zone)."""
    if confined:
        env = {key: os.environ[key] for key in CONFINED_KEPT if key in os.environ}
        env.update({"PATH": SYSTEM_PATH, "HOME": str(scratch)})
    else:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("TUNEPLANE_", "CUDA_", "NVIDIA_"))
        }
    env.update(own_env(spec, scratch, storage_root))
    return env


# H4: a member marks each checkpoint it saved by changing this file in its scratch dir.
CHECKPOINT_MARK = ".tuneplane-checkpoint"

# What a confined member keeps of the agent's environment: how text and time read, nothing
# that names the agent's home, its tools or its credentials.
CONFINED_KEPT = ("LANG", "LC_ALL", "LC_CTYPE", "TZ")


def own_env(spec: MemberSpec, scratch: Path, storage_root: str | None = None) -> dict:
    """What the member's env says of it alone (all a container gets)."""
    cards = sorted(spec.cards, key=lambda card: card.index)
    env = {key: str(value) for key, value in spec.env.items()}
    env.update(
        {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": ",".join(str(card.index) for card in cards),
            "NVIDIA_VISIBLE_DEVICES": ",".join(card.uuid for card in cards) or "void",
            "TUNEPLANE_SCRATCH_DIR": str(scratch),
            # H4: the member touches (or writes) this file once a checkpoint is saved.
            "TUNEPLANE_CHECKPOINT_MARK": str(scratch / CHECKPOINT_MARK),
        }
    )
    env.update({key: str(value) for key, value in spec.labels.items()})
    shared = spec.delivery_mode == "shared-mount"
    for key, value in spec.delivery_env.items():
        env[key] = str(Path(storage_root or "/", str(value))) if shared else str(value)
    env.update({key: str(value) for key, value in spec.rendezvous.items()})
    if spec.serve is not None:
        env["PORT"] = str(spec.serve.port)  # a replica listens there (S1)
    return env


def argv_of(spec: MemberSpec, scratch: Path, script_at: Path | None = None) -> list[str]:
    """What runs: its argv, or its script written (to ``script_at``, else its scratch dir,
    named from there: a member under a uid of its own may not pass the dirs above it) and
    run by bash."""
    if spec.script:
        write_new(script_at or scratch / "script.sh", spec.script)
        return ["/bin/bash", str(script_at) if script_at else "./script.sh"]
    return list(spec.argv)


def write_new(path: Path, text: str, mode: int = 0o644) -> None:
    """Written as a new file, never through what is there: a symlink a member planted in
    its scratch dir (which it owns, or a container mounts) is removed, not followed (R14)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


# What the container runtime's CLI runs with: a fixed PATH and the agent's own settings for
# reaching its daemon — never the member's env, which goes in through an env file (R14).
RUNTIME_ENV = ("DOCKER_HOST", "DOCKER_CONFIG", "CONTAINER_HOST", "XDG_RUNTIME_DIR", "HOME")


def runtime_env() -> dict:
    env = {key: os.environ[key] for key in RUNTIME_ENV if key in os.environ}
    return {**env, "PATH": SYSTEM_PATH}


def env_file_text(env: dict) -> str:
    """``NAME=value`` lines for the runtime's ``--env-file``; a value with a line break
    cannot be carried there and is left out (logged by the caller)."""
    return "".join(f"{key}={value}\n" for key, value in env.items() if "\n" not in str(value))


def spawn(argv: list[str], log_path: Path, **options) -> subprocess.Popen:
    """A process in a session of its own (it outlives the agent, R6), its output appended to
    its log. OSError when it cannot start."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            **options,
        )
