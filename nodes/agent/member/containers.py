"""Members that run in a container: a start naming an ``image`` on a node with a container
runtime (docker or podman) (DESIGN §7).

The member is still started by the agent's wrapper (launch.WRAPPER), in a session of its
own, its exit code in its exit file and its output in its log: the wrapper runs the
runtime's foreground ``run``, whose exit code is the container's. The container itself is
the runtime's child, not the agent's, so everything that ends it goes through the runtime
by the container's name, ``tuneplane-<member id>``; it carries the labels
``tuneplane.member=<member id>`` and ``tuneplane.scope=<node id>``, so that a lost state
file is rebuilt from what runs (R6) and a cleanup by id finds it (R7). Its CPU and memory
are confined by the runtime (``--cpus``, ``--memory`` with no swap beyond it); it gets the
member's env (R4), its scratch dir and the storage root at the same paths, and the host's
network (a replica's port, a gang's rendezvous). ``--init`` puts a small init as PID 1, so a
stop's SIGTERM reaches the member's process.
"""

import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

from ..wire import MemberSpec

logger = logging.getLogger("tuneplane-node")

RUNTIMES = ("docker", "podman")
# `<runtime> info` asks the daemon (docker) or the engine (podman): a CLI alone is no runtime.
VERSION_FORMAT = {"docker": "{{.ServerVersion}}", "podman": "{{.Version.Version}}"}
# The member label of each container `ps` lists (docker's labels are a string, podman's a map).
LABEL_FORMAT = {
    "docker": '{{.Label "tuneplane.member"}} {{.State}}',
    "podman": '{{index .Labels "tuneplane.member"}} {{.State}}',
}
PROBE_TIMEOUT = 5.0
PROBE_EVERY = 30.0  # the inventory is probed every beat; the runtime this often
RUNTIME_TIMEOUT = 30.0  # inspect, kill, rm
LABEL_MEMBER = "tuneplane.member"
LABEL_SCOPE = "tuneplane.scope"
# A script runs by /bin/bash where the image has it, else by its /bin/sh.
SCRIPT_RUNNER = 'if [ -x /bin/bash ]; then exec /bin/bash "$0"; fi; exec /bin/sh "$0"'
# The script is written outside the scratch dir and mounted read-only here.
SCRIPT_IN_CONTAINER = "/.tuneplane-script.sh"


def name_of(member_id: str) -> str:
    return f"tuneplane-{member_id}"


def runtime_named(container_runtime: str | None) -> str:
    """The runtime an inventory's ``container_runtime`` ("docker 20.10.24") names, or ""."""
    word = (container_runtime or "").strip().split(" ", 1)[0].lower()
    return word if word in RUNTIMES else ""


def probe() -> str | None:
    """The first runtime whose daemon or engine answers, with its version ("docker
    20.10.24"); None when none does."""
    for runtime in RUNTIMES:
        if shutil.which(runtime) is None:
            continue
        try:
            done = subprocess.run(
                [runtime, "info", "--format", VERSION_FORMAT[runtime]],
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        version = done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""
        if done.returncode == 0 and version:
            return f"{runtime} {version}"
    return None


class RuntimeProbe:
    """The runtime as last probed, probed again at most every PROBE_EVERY seconds."""

    def __init__(self, every: float = PROBE_EVERY):
        self.every = every
        self.value: str | None = None
        self.at: float | None = None

    def __call__(self) -> str | None:
        now = time.monotonic()
        if self.at is None or now - self.at >= self.every:
            self.value, self.at = probe(), now
        return self.value


def _run(runtime: str, *args: str, timeout: float = RUNTIME_TIMEOUT) -> str | None:
    """The runtime's answer, or None when it failed (logged)."""
    try:
        done = subprocess.run(
            [runtime, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        logger.warning("%s %s: %s", runtime, args[0], error)
        return None
    if done.returncode != 0:
        return None
    return done.stdout


def _gpus(runtime: str, cards) -> list[str]:
    """Exactly its cards, by UUID, where the NVIDIA container toolkit is installed (without
    it there are no cards to pass; the member's CUDA_/NVIDIA_VISIBLE_DEVICES still say)."""
    if not cards or not (shutil.which("nvidia-container-cli") or shutil.which("nvidia-ctk")):
        return []
    uuids = [card.uuid for card in cards]
    if runtime == "podman":  # CDI names
        return [option for uuid in uuids for option in ("--device", f"nvidia.com/gpu={uuid}")]
    return ["--gpus", f'"device={",".join(uuids)}"']


def run_argv(
    runtime: str,
    *,
    member_id: str,
    scope: str,
    spec: MemberSpec,
    env_file,
    scratch,
    storage_root: str | None,
    script=None,
    uid: int | None = None,
) -> list[str]:
    """The runtime's foreground ``run`` for a member (R14): the runtime's CLI by its absolute
    path; the member's env from an env file outside anything mounted (never on a command
    line, never in the CLI's own environment); no capabilities, no new privileges, its pids
    limit and, where the agent gives members uids, its own uid; its scratch dir, and of the
    storage root only its own volumes (read-write) and datasets (read-only)."""
    argv = [shutil.which(runtime) or runtime, "run", "--init", "--name", name_of(member_id)]
    argv += ["--label", f"{LABEL_MEMBER}={member_id}", "--label", f"{LABEL_SCOPE}={scope}"]
    argv += ["--network", "host", "--workdir", str(scratch), "-v", f"{scratch}:{scratch}"]
    argv += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
    if spec.pull == "always":
        argv += ["--pull", "always"]  # the registry says whether this project may run it
    if spec.pids:
        argv += ["--pids-limit", str(spec.pids)]
    if uid is not None:
        argv += ["--user", f"{uid}:{uid}"]
    if spec.delivery_mode == "shared-mount" and storage_root:
        for key, relative in sorted(spec.delivery_env.items()):
            path = Path(storage_root, str(relative))
            mode = ":ro" if key.startswith("TUNEPLANE_DATASET_") else ""
            argv += ["-v", f"{path}:{path}{mode}"]
    if spec.cpus:
        # The runtime refuses more CPUs than the machine has; a budget may name more.
        argv += ["--cpus", f"{min(spec.cpus, os.cpu_count() or spec.cpus):g}"]
    if spec.memory_bytes:
        memory = str(spec.memory_bytes)
        argv += ["--memory", memory, "--memory-swap", memory]  # no swap beyond it: an OOM
    argv += _gpus(runtime, spec.cards)
    argv += ["--env-file", str(env_file)]
    if script is not None:
        argv += ["-v", f"{script}:{SCRIPT_IN_CONTAINER}:ro"]
        entry = ["--entrypoint", "/bin/sh", spec.image, "-c", SCRIPT_RUNNER, SCRIPT_IN_CONTAINER]
        return [*argv, *entry]
    return [*argv, spec.image, *spec.argv]


def inspect(runtime: str, member_id: str) -> dict | None:
    """The container's state: {"running", "exit_code", "oom_killed"}; None when there is none."""
    out = _run(
        runtime,
        "inspect",
        "--type",
        "container",
        "--format",
        "{{.State.Running}} {{.State.ExitCode}} {{.State.OOMKilled}}",
        name_of(member_id),
    )
    parts = (out or "").split()
    if len(parts) != 3:
        return None
    return {
        "running": parts[0] == "true",
        "exit_code": int(parts[1]) if parts[1].lstrip("-").isdigit() else -1,
        "oom_killed": parts[2] == "true",
    }


def node_oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has ended on this node since its boot."""
    try:
        lines = Path("/proc/vmstat").read_text().splitlines()
        counts = dict(line.split(maxsplit=1) for line in lines)
        return int(counts["oom_kill"])
    except (OSError, ValueError, KeyError):
        return None


def oom_ended(found: dict | None, kills_at_launch: int | None, stopping: bool) -> bool:
    """Whether the kernel's OOM killer ended a container ``inspect`` found exited.

    The runtime's flag says so, except when it lost the event: on cgroup v1, containerd's
    shim drops an OOM event it reads after the container's cgroup is gone (seen here under
    CPU load, once in 20 OOMs). So an exit by SIGKILL (137) that no stop of ours sent, while
    the node's OOM-kill count rose since the launch of a member with a memory limit, is one.
    """
    if found is None or found["oom_killed"]:
        return found is not None
    now = node_oom_kills()
    return (
        found["exit_code"] == 137
        and not stopping
        and None not in (kills_at_launch, now)
        and now > kills_at_launch
    )


def stop(runtime: str, member_id: str, grace: float) -> None:
    """SIGTERM to the container's PID 1, SIGKILL after the grace — by the runtime, which
    finishes it even if the agent restarts meanwhile. Not waited for."""
    try:
        subprocess.Popen(
            [runtime, "stop", "--time", str(max(int(grace), 0)), name_of(member_id)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as error:
        logger.warning("%s stop %s: %s", runtime, member_id, error)


def kill(runtime: str, member_id: str) -> None:
    _run(runtime, "kill", name_of(member_id))


def remove(runtime: str, member_id: str) -> bool:
    """The container gone, whatever its state; whether it is gone now."""
    _run(runtime, "rm", "--force", name_of(member_id))
    return inspect(runtime, member_id) is None


def members(runtime: str, scope: str) -> dict[str, bool]:
    """The member ids with a container under the agent's scope (its node id), and whether
    each runs: what a lost state file is rebuilt from."""
    out = _run(
        runtime,
        "ps",
        "--all",
        "--filter",
        f"label={LABEL_SCOPE}={scope}",
        "--format",
        LABEL_FORMAT[runtime],
    )
    found = {}
    for line in (out or "").splitlines():
        member_id, _, state = line.strip().partition(" ")
        if member_id:
            found[member_id] = state == "running"
    return found
