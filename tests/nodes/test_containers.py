"""Members that run in a container (DESIGN §7, R1, R4–R7): a start naming an image, on a
node with a container runtime, through the agent's own command handling against a real
dockerd of the session's own (tests/dockerd.py) — what the stream delivers is
tests/e2e/test_container_jobs.py."""

import os
import signal
import subprocess
import time

import pytest

from nodes.agent.executor import Executor
from nodes.agent.member import cgroups, containers
from nodes.agent.member.adoption import adopt_orphans
from nodes.agent.wire import MemberSpec
from tests.conftest import H100_DEVICES
from tests.dockerd import IMAGE, unique_scope

pytestmark = pytest.mark.e2e

CARDS = [{"index": d["index"], "uuid": d["uuid"]} for d in H100_DEVICES]


def commands(directory, scope, storage_root, runtime="docker"):
    return Executor(
        directory,
        devices=lambda: H100_DEVICES,
        storage_root=str(storage_root),
        scope=scope,
        runtime=lambda: runtime,
    )


@pytest.fixture
def node(dockerd, tmp_path):
    """An agent's commands with docker, and a cgroup scope and container label of their own."""
    scope = unique_scope()
    (tmp_path / "storage").mkdir()
    yield commands(tmp_path / "state", scope, tmp_path / "storage")
    for member_id in containers.members("docker", scope):
        containers.remove("docker", member_id)
    for member_id in cgroups.cgroup_members(scope):
        cgroups.signal_member(None, f"{scope}/{member_id}", cgroups.SIGKILL)
        cgroups.release(f"{scope}/{member_id}")


def start(node, member_id, cards=(), **payload):
    return node.accept(member_id, "start", {"cards": list(cards), "image": IMAGE, **payload})


def member(node, member_id):
    node.tick()  # the agent looks at what runs every second
    return next(c for c in node.known() if c.command_id == member_id)


def until(node, member_id, check, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = member(node, member_id)
        if check(found):
            return found
        time.sleep(0.1)
    raise AssertionError(f"{member_id}: {member(node, member_id)}")


def settled(node, member_id, timeout=30):
    return until(node, member_id, lambda c: c.state != "running", timeout)


def log(node, member_id) -> str:
    read = node.log_read(member_id, 65536)
    return (read.data if read else b"").decode()


def running_in_docker(member_id) -> bool:
    found = containers.inspect("docker", member_id)
    return bool(found and found["running"])


def test_R4_a_member_in_a_container_gets_its_cards_env_delivery_and_mounts(node, tmp_path):
    (tmp_path / "storage" / "ml").mkdir()
    (tmp_path / "storage" / "ml" / "x.txt").write_text("the dataset\n")
    started = start(
        node,
        "m-env",
        [CARDS[5], CARDS[2]],
        argv=["sh", "-c", 'env; cat "$TUNEPLANE_DATASET_X/x.txt"; pwd'],
        env={"LR": "1e-3", "SECRET": "s3cr3t"},
        labels={"TUNEPLANE_RANK": 0},
        delivery={"mode": "shared-mount", "env": {"TUNEPLANE_DATASET_X": "ml"}},
        rendezvous={"MASTER_ADDR": "10.0.0.1", "WORLD_SIZE": 16},
        cpus=0.5,
        memory_bytes=64 << 20,
    )
    assert (started.state, started.confinement, started.container) == (
        "running",
        "container: docker",
        "docker",
    )
    ended = settled(node, "m-env")
    assert (ended.state, ended.exit_code, ended.reason) == ("succeeded", 0, "exit")
    out = log(node, "m-env").splitlines()
    assert "CUDA_VISIBLE_DEVICES=2,5" in out  # PCI bus order: by index
    assert f"NVIDIA_VISIBLE_DEVICES={CARDS[2]['uuid']},{CARDS[5]['uuid']}" in out
    assert {"CUDA_DEVICE_ORDER=PCI_BUS_ID", "LR=1e-3", "TUNEPLANE_RANK=0"} <= set(out)
    assert {"MASTER_ADDR=10.0.0.1", "WORLD_SIZE=16", "SECRET=s3cr3t"} <= set(out)
    assert f"TUNEPLANE_DATASET_X={tmp_path / 'storage' / 'ml'}" in out
    assert "the dataset" in out  # the storage root is mounted at its own path
    scratch = str(tmp_path / "state" / "members" / "m-env")
    assert f"TUNEPLANE_SCRATCH_DIR={scratch}" in out and out[-1] == scratch
    assert "PATH=/bin" in out  # the image's, not the agent's environment
    # The container carries the member's id and the agent's scope (R6), and its limits.
    shown = subprocess.run(
        [
            "docker",
            "inspect",
            "--format",
            '{{index .Config.Labels "tuneplane.member"}} {{index .Config.Labels "tuneplane.scope"}}'
            " {{.HostConfig.NanoCpus}} {{.HostConfig.Memory}} {{.HostConfig.MemorySwap}}",
            "tuneplane-m-env",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert shown == ["m-env", node.scope, "500000000", str(64 << 20), str(64 << 20)]
    # The member's env is never on a command line (`ps` shows command lines to anyone).
    assert "s3cr3t" not in " ".join(
        containers.run_argv(
            "docker",
            member_id="m",
            scope="s",
            spec=MemberSpec.parse({"image": IMAGE, "env": {"SECRET": "s3cr3t"}, "cards": []}),
            env_file="/state/commands/m.env",
            scratch="/x",
            storage_root=None,
        )
    )


def test_a_container_member_ends_with_its_exit_code_and_a_script_runs_in_it(node):
    start(node, "m-exit", argv=["sh", "-c", "echo out; exit 7"])
    ended = settled(node, "m-exit")
    assert (ended.state, ended.exit_code, ended.reason) == ("failed", 7, "exit")
    assert "out" in log(node, "m-exit")
    start(node, "m-script", script="echo from the script; exit 0")
    assert settled(node, "m-script").state == "succeeded"
    assert "from the script" in log(node, "m-script")


def test_R5_a_container_member_over_its_memory_ends_oom(node):
    start(
        node,
        "m-hungry",
        argv=["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=4"],
        memory_bytes=16 << 20,
    )
    ended = settled(node, "m-hungry")
    assert (ended.state, ended.reason, ended.confinement) == ("failed", "oom", "container: docker")
    assert ended.exit_code == 137
    # docker can lose the OOM (containerd drops an event read after the cgroup is gone): a
    # 137 no stop sent, with the node's OOM-kill count up since the launch, is still one.
    lost = {"running": False, "exit_code": 137, "oom_killed": False}
    assert ended.oom_kills is not None and containers.node_oom_kills() > ended.oom_kills
    assert containers.oom_ended(lost, ended.oom_kills, stopping=False)
    assert not containers.oom_ended(lost, ended.oom_kills, stopping=True)  # our SIGKILL
    assert not containers.oom_ended(lost, containers.node_oom_kills(), stopping=False)
    assert not containers.oom_ended({**lost, "exit_code": 1}, ended.oom_kills, stopping=False)


def test_R10_a_container_member_is_stopped_sigterm_then_sigkill_after_the_grace(node):
    trap = 'trap "echo got TERM; exit 3" TERM; echo ready; while :; do sleep 0.1; done'
    start(node, "m-polite", argv=["sh", "-c", trap])
    start(node, "m-stubborn", argv=["sh", "-c", "trap '' TERM; echo ready; sleep 600"])
    for member_id in ("m-polite", "m-stubborn"):
        until(node, member_id, lambda c, m=member_id: "ready" in log(node, m))
    node.accept("c-stop-1", "stop", {"member": "m-polite", "grace_seconds": 30})
    node.accept("c-stop-2", "stop", {"member": "m-stubborn", "grace_seconds": 1})
    polite = settled(node, "m-polite")
    assert (polite.state, polite.reason, polite.exit_code) == ("failed", "stopped", 3)
    assert "got TERM" in log(node, "m-polite")  # --init passed the SIGTERM on
    stubborn = settled(node, "m-stubborn")
    assert (stubborn.state, stubborn.reason) == ("failed", "stopped")
    assert not running_in_docker("m-stubborn")  # the runtime killed it: not only its client


def test_R7_cleanup_removes_the_container_and_the_scratch_also_for_an_unknown_member(node):
    start(node, "m-left", argv=["sleep", "600"])
    until(node, "m-left", lambda c: running_in_docker("m-left"))
    node.accept("c-clean", "cleanup", {"member": "m-left", "grace_seconds": 1})
    cleaned = until(node, "m-left", lambda c: c.cleaned)
    assert cleaned.state == "failed" and containers.inspect("docker", "m-left") is None
    assert not (node.scratch / "m-left").exists()
    # A container whose member this node has no state of at all is still found by its name.
    subprocess.run(
        ["docker", "run", "-d", "--name", "tuneplane-m-stray", IMAGE, "sleep", "600"],
        check=True,
        capture_output=True,
    )
    answer = node.accept("c-clean-stray", "cleanup", {"member": "m-stray"})
    assert (answer.state, answer.reason) == ("succeeded", "unknown_member")
    assert containers.inspect("docker", "m-stray") is None


def test_R6_a_restarted_agent_keeps_its_container_members_and_rebuilds_lost_state(node, tmp_path):
    start(node, "m-kept", argv=["sleep", "600"])
    start(node, "m-orphan", argv=["sh", "-c", "sleep 2; exit 5"])
    for member_id in ("m-kept", "m-orphan"):
        until(node, member_id, lambda c, m=member_id: running_in_docker(m))
    # The agent restarts: a new Commands over the same state dir sees both running.
    again = commands(node.root, node.scope, tmp_path / "storage")
    assert [member(again, m).state for m in ("m-kept", "m-orphan")] == ["running", "running"]
    # m-orphan's state file is lost and its wrapper and runtime client killed: only the
    # container, labelled with its id, is left — and it is adopted from that label.
    wrapper = member(again, "m-orphan").pid
    os.killpg(wrapper, signal.SIGKILL)
    (node.directory / "m-orphan.json").unlink()
    third = commands(node.root, node.scope, tmp_path / "storage")
    assert adopt_orphans(third.runner) == ["m-orphan"]
    adopted = member(third, "m-orphan")
    assert (adopted.state, adopted.reason, adopted.container) == ("running", "adopted", "docker")
    ended = settled(third, "m-orphan")  # read back from the container itself
    assert (ended.state, ended.exit_code, ended.reason) == ("failed", 5, "exit")
    third.accept("c-clean", "cleanup", {"member": "m-orphan", "grace_seconds": 0})
    assert until(third, "m-orphan", lambda c: c.cleaned)
    assert containers.inspect("docker", "m-orphan") is None
    assert member(third, "m-kept").state == "running"


def test_R1_an_image_on_a_node_without_a_runtime_is_refused(tmp_path):
    node = commands(tmp_path / "state", unique_scope(), tmp_path, runtime="")
    refused = start(node, "m-no-runtime", argv=["true"])
    assert (refused.state, refused.reason, refused.cleaned) == ("failed", "refused", True)
    assert containers.runtime_named("docker 20.10.24+dfsg1") == "docker"
    assert containers.runtime_named("Docker version 28.2.2") == "docker"
    assert containers.runtime_named("") == containers.runtime_named("runc 1.1") == ""


def test_the_inventory_reports_the_runtime_whose_daemon_answers(dockerd, monkeypatch):
    assert containers.probe().startswith("docker ")
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert containers.probe() is None  # a CLI with no daemon behind it is no runtime


def test_R14_the_runtime_cli_never_runs_with_the_members_env_or_from_its_path(node, tmp_path):
    """A member whose env puts its scratch dir first on PATH and preloads a library: the
    runtime's CLI is run by its absolute path with the agent's fixed environment, so a
    ``docker`` planted in the scratch dir never runs on the host, and the CLI never loads
    what LD_PRELOAD names; the container still gets the member's env."""
    marker = tmp_path / "planted-docker-ran"
    scratch = node.scratch / "m-path"
    scratch.mkdir(parents=True)
    planted = scratch / "docker"
    planted.write_text(f"#!/bin/sh\ntouch {marker}\nexit 0\n")
    planted.chmod(0o755)
    start(
        node,
        "m-path",
        argv=["sh", "-c", 'echo "in the container: $LD_PRELOAD $PATH"'],
        env={"PATH": ".:/bin", "LD_PRELOAD": "/no/such/library.so"},
    )
    ended = settled(node, "m-path")
    output = log(node, "m-path")
    assert (ended.state, ended.exit_code) == ("succeeded", 0), output
    assert "in the container: /no/such/library.so .:/bin" in output
    assert "cannot be preloaded" not in output  # the CLI ran without the member's env
    assert not marker.exists()


def test_R14_a_symlink_planted_in_the_scratch_dir_is_never_written_through(node, tmp_path):
    """The agent writes a member's script anew, never through what the member left there: a
    container's script is written outside its mounted scratch dir, and a process member's
    over a planted ``script.sh`` symlink replaces the link, not the file it names."""
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    for member_id, image in (("m-link-c", IMAGE), ("m-link-p", None)):
        scratch = node.scratch / member_id
        scratch.mkdir(parents=True)
        (scratch / "script.sh").symlink_to(victim)
        payload = {"cards": [], "script": "echo written anew"}
        if image:
            payload["image"] = image
        node.accept(member_id, "start", payload)
        ended = settled(node, member_id)
        assert (ended.state, log(node, member_id)) == ("succeeded", "written anew\n")
    assert victim.read_text() == "untouched\n"


def test_R14_a_container_gets_its_own_datasets_read_only_and_no_capabilities(node, tmp_path):
    storage = tmp_path / "storage"
    (storage / "ml" / "datasets" / "x").mkdir(parents=True)
    (storage / "ml" / "datasets" / "x" / "data.txt").write_text("ours\n")
    (storage / "other" / "volumes" / "theirs").mkdir(parents=True)
    (storage / "other" / "volumes" / "theirs" / "secret.txt").write_text("theirs\n")
    script = (
        'cat "$TUNEPLANE_DATASET_X/data.txt"; '
        'echo x > "$TUNEPLANE_DATASET_X/new" 2>/dev/null && echo dataset-writable; '
        f"cat {storage}/other/volumes/theirs/secret.txt 2>/dev/null || echo other-project-unseen; "
        "grep CapEff /proc/self/status; grep NoNewPrivs /proc/self/status"
    )
    start(
        node,
        "m-mounts",
        argv=["sh", "-c", script],
        delivery={"mode": "shared-mount", "env": {"TUNEPLANE_DATASET_X": "ml/datasets/x"}},
        pids=64,
    )
    ended = settled(node, "m-mounts")
    output = log(node, "m-mounts")
    assert ended.state == "succeeded", output
    assert "ours" in output and "other-project-unseen" in output, output
    assert "dataset-writable" not in output
    assert "CapEff:\t0000000000000000" in output and "NoNewPrivs:\t1" in output, output
    shown = subprocess.run(
        ["docker", "inspect", "--format", "{{.HostConfig.PidsLimit}}", "tuneplane-m-mounts"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert shown == ["64"]


def test_R14_a_fleet_that_pulls_always_never_runs_a_cached_image_without_the_registry(node):
    """The image is in this node's cache (another project pulled it, say); on a Fleet whose
    config says ``image_pull: always`` the runtime asks the registry first, and with no
    registry saying yes (none answers here) the member does not run."""
    start(node, "m-cached", argv=["echo", "ran from the cache"])
    assert settled(node, "m-cached").state == "succeeded"  # the runtime's default: the cache
    start(node, "m-pulled", argv=["echo", "ran from the cache"], pull="always")
    ended = settled(node, "m-pulled", timeout=60)
    assert ended.state == "failed" and ended.exit_code != 0
    assert "ran from the cache" not in log(node, "m-pulled")
