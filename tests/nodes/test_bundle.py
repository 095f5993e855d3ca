"""A confined member's bundle and keeper, decided without a runtime (R17, R18, R21): what the
privileged side runs never depends on the member's env; the config says every part of the
wall; the seccomp profile refuses what a process without capabilities must not do; the
keeper's log never grows past its cap and one read."""

import json
import os
import string
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodes.agent.member import bundle, containers, launch, logs, network, sandbox, shim
from nodes.agent.member.bundle import Device
from nodes.agent.member.record import Member
from nodes.agent.member.runner import Runner, served_ports
from nodes.agent.member.store import Store
from nodes.agent.wire import MemberSpec

PROFILE = {
    "defaultAction": "SCMP_ACT_ERRNO",
    "defaultErrnoRet": 38,
    "archMap": [
        {"architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_X86"]},
        {"architecture": "SCMP_ARCH_AARCH64", "subArchitectures": ["SCMP_ARCH_ARM"]},
    ],
    "syscalls": [
        {
            "names": ["read", "write", "unshare", "mount", "clone", "keyctl"],
            "action": "SCMP_ACT_ALLOW",
        },
        {"names": ["arch_prctl"], "action": "SCMP_ACT_ALLOW", "includes": {"arches": ["amd64"]}},
        {"names": ["s390_only"], "action": "SCMP_ACT_ALLOW", "includes": {"arches": ["s390x"]}},
        {"names": ["not_on_amd64"], "action": "SCMP_ACT_ALLOW", "excludes": {"arches": ["amd64"]}},
        {"names": ["bpf"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
        {
            "names": ["bpf"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": 1,
            "excludes": {"caps": ["CAP_SYS_ADMIN"]},
        },
    ],
}


def sandbox_of(**changes) -> bundle.Sandbox:
    base = {
        "uid": 61234,
        "argv": ("/bin/bash", "/run/tuneplane/script.sh"),
        "env": {"HOME": "/scratch"},
        "cwd": "/var/lib/tuneplane/members/m-1",
        "hostname": "m-1",
        "cgroups_path": "/tuneplane/node-1/m-1",
    }
    return bundle.Sandbox(**{**base, **changes})


HOSTILE = ["PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "BASH_ENV", "ENV", "IFS", "PYTHONPATH"]
HOSTILE += ["GCONV_PATH", "PYTHONHOME", "PYTHONSTARTUP", "LD_AUDIT", "SHELLOPTS", "PS4"]
names = st.one_of(
    st.sampled_from(HOSTILE), st.text(string.ascii_uppercase + "_", min_size=1, max_size=12)
)
values = st.text(min_size=0, max_size=40).filter(lambda value: "\x00" not in value)


@settings(max_examples=200, deadline=None)
@given(env=st.dictionaries(names, values, max_size=8))
def test_R17_the_members_env_reaches_its_own_process_only(env):
    """A property over env names and values: the bundle differs only in the member's own
    process env."""
    quiet, hostile = sandbox_of(env={}), sandbox_of(env=env)
    quiet_config, hostile_config = bundle.config(quiet, None), bundle.config(hostile, None)
    assert hostile_config["process"]["env"] == [f"{k}={v}" for k, v in env.items()]
    hostile_config["process"]["env"] = quiet_config["process"]["env"]
    assert hostile_config == quiet_config


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(env=st.dictionaries(names, values, max_size=6))
def test_R17_what_the_agent_runs_as_root_is_the_same_whatever_the_members_env(
    env, tmp_path_factory, monkeypatch
):
    """A runner starting a confined member: the keeper it spawns as root gets the same argv,
    environment and working dir, and the bundle the same files, whatever the member's env;
    only the member's own process env in config.json differs."""
    if os.geteuid() != 0:
        pytest.fail("as root: a runner confines members only as root")
    spawned = []
    # Its network is network.py's, tested on its own (tests/nodes/test_network.py): here the
    # namespace it would join, as attach() returns it.
    wired = network.Attached(netns="/run/netns/tp-prop", address="10.213.9.9", gateway="10.213.9.1")
    monkeypatch.setattr(network, "attach", lambda *args, **kwargs: wired)
    monkeypatch.setattr(
        launch,
        "spawn",
        lambda argv, log, **kw: spawned.append((argv, kw)) or subprocess.Popen(["/bin/true"]),
    )

    def started(member_env):
        root = tmp_path_factory.mktemp("state")
        runner = Runner(Store(root), root, scope="prop", uids=(64990, 64999))
        runner.start("m-1", {"cards": [], "script": "exit 0", "env": member_env})
        argv, options = spawned.pop()
        box = runner.sandbox.bundle("m-1")
        config = json.loads((box / "config.json").read_text())
        env_of_member = config["process"].pop("env")
        files = sorted(str(p.relative_to(box)) for p in box.rglob("*"))
        text = json.dumps([argv, options, config, files], default=str)
        member_env = dict(item.split("=", 1) for item in env_of_member)
        return text.replace(str(root), "ROOT"), {
            key: value.replace(str(root), "ROOT") for key, value in member_env.items()
        }

    quiet, quiet_env = started({})
    hostile, hostile_env = started(env)
    assert hostile == quiet
    agents = {"CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"}
    agents.add("TUNEPLANE_SCRATCH_DIR")

    def agents_part(member_env):
        return {k: v for k, v in member_env.items() if k not in env or k in agents}

    assert agents_part(hostile_env) == agents_part(quiet_env)
    assert all(hostile_env[k] == v for k, v in env.items() if k not in agents)


def test_R17_every_program_the_privileged_side_runs_is_named_by_its_absolute_path():
    paths = sandbox.Paths(Path("/var/lib/tuneplane"))
    argv = sandbox.keeper_argv(paths, "m-1", Path("/e"), Path("/l"), 100)
    assert Path(argv[0]).is_absolute() and Path(argv[5]).is_absolute()
    # Isolated, without site's .pth files, importing from the agent's own package dir only.
    assert argv[1:4] == ["-I", "-S", "-c"] and repr(str(sandbox.PACKAGE_ROOT)) in argv[4]
    assert sandbox.PACKAGE_ROOT.is_absolute() and (sandbox.PACKAGE_ROOT / "nodes").is_dir()
    assert all(Path(path).is_absolute() for path in sandbox.RUNTIMES)
    assert bundle.config(sandbox_of(), None)["process"]["args"][0] == bundle.INIT == "/usr/bin/tini"


def test_R11_R13_R18_the_config_holds_every_part_of_the_wall():
    """R11: its own uid and gid, no other group, no new privileges; R13: its cgroup's files
    read-only in a cgroup namespace of its own, so it cannot leave its cgroup; R18: the rest."""
    config = bundle.config(sandbox_of(pids=40, memory_bytes=1 << 30, cpus=1.5), {"x": 1})
    process, linux = config["process"], config["linux"]
    assert process["user"] == {"uid": 61234, "gid": 61234, "additionalGids": []}
    assert process["noNewPrivileges"] is True and not process["terminal"]
    assert all(caps == [] for caps in process["capabilities"].values())
    assert len(process["capabilities"]) == 5
    assert {ns["type"] for ns in linux["namespaces"]} == set(bundle.NAMESPACES)
    assert bundle.NAMESPACES == ("pid", "ipc", "uts", "mount", "network", "cgroup")
    assert config["root"] == {"path": "rootfs", "readonly": True}
    assert linux["seccomp"] == {"x": 1}
    assert "/proc/kcore" in linux["maskedPaths"] and "/proc/sys" in linux["readonlyPaths"]
    assert linux["resources"]["pids"] == {"limit": 40}
    assert linux["resources"]["memory"] == {"limit": 1 << 30, "swap": 1 << 30}
    assert linux["resources"]["cpu"] == {"quota": 150_000, "period": 100_000}
    assert linux["resources"]["devices"] == [{"allow": False, "access": "rwm"}]
    mounts = {mount["destination"]: mount for mount in config["mounts"]}
    for host in ("/usr", "/etc"):
        assert mounts[host]["source"] == host and "ro" in mounts[host]["options"]
    for private in ("/tmp", "/var/tmp", "/dev/shm", "/run"):
        assert mounts[private]["type"] == "tmpfs", private
        assert any(option.startswith("size=") for option in mounts[private]["options"])
    assert mounts["/dev/mqueue"]["type"] == "mqueue" and mounts["/proc"]["type"] == "proc"
    assert "ro" in mounts["/sys/fs/cgroup"]["options"] and "ro" in mounts["/sys"]["options"]
    assert not [m for m in config["mounts"] if m["source"] in ("/", "/var", "/root", "/home")]


def test_R18_R19_a_network_namespace_of_its_own_or_the_one_its_network_was_wired_in():
    def network(sandbox_):
        namespaces = bundle.config(sandbox_, None)["linux"]["namespaces"]
        return [ns for ns in namespaces if ns["type"] == "network"]

    assert network(sandbox_of()) == [{"type": "network"}]
    assert network(sandbox_of(netns="/run/netns/tp-1")) == [
        {"type": "network", "path": "/run/netns/tp-1"}
    ]
    assert network(sandbox_of(netns="host")) == []


def test_R12_R18_dev_holds_exactly_its_cards_and_none_without_cards():
    assert bundle.card_devices(set(), {"nvidia-uvm": 511}) == ()
    devices = bundle.card_devices({3, 1}, {"nvidia-uvm": 511})
    paths = [device.path for device in devices]
    assert paths[:2] == ["/dev/nvidia1", "/dev/nvidia3"]
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm"} <= set(paths) and "/dev/nvidia0" not in paths
    assert (devices[1].major, devices[1].minor) == (195, 3)
    config = bundle.config(sandbox_of(devices=devices), None)
    allowed = [rule for rule in config["linux"]["resources"]["devices"] if rule["allow"]]
    assert {(rule["major"], rule["minor"]) for rule in allowed} == {
        (device.major, device.minor) for device in devices
    }
    no_uvm = bundle.card_devices({0}, {"nvidia-uvm": None})
    assert [device.path for device in no_uvm] == [
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/nvidia-modeset",
    ]


def test_R18_the_seccomp_profile_refuses_namespaces_mounts_and_keys_to_a_process_without_caps():
    seccomp = bundle.seccomp_of(PROFILE, machine="x86_64")
    assert seccomp["architectures"] == ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86"]
    assert seccomp["defaultAction"] == "SCMP_ACT_ERRNO" and seccomp["defaultErrnoRet"] == 38
    allowed = {
        name
        for rule in seccomp["syscalls"]
        if rule["action"] == "SCMP_ACT_ALLOW" and not rule.get("args")
        for name in rule["names"]
    }
    assert {"read", "write", "arch_prctl"} <= allowed
    assert not {"unshare", "mount", "keyctl", "clone", "bpf", "s390_only", "not_on_amd64"} & allowed
    refused = next(rule for rule in seccomp["syscalls"] if "unshare" in rule["names"])
    assert refused["action"] == "SCMP_ACT_ERRNO" and refused["errnoRet"] == 1
    assert {"setns", "mount", "keyctl", "add_key", "pivot_root"} <= set(refused["names"])
    clone = next(rule for rule in seccomp["syscalls"] if rule["names"] == ["clone"])
    assert clone["args"][0]["op"] == "SCMP_CMP_MASKED_EQ"
    assert clone["args"][0]["value"] == 0x7E020000  # every CLONE_NEW* flag
    bpf = [rule for rule in seccomp["syscalls"] if "bpf" in rule["names"]]
    assert bpf == [{"names": ["bpf"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}]
    arm = bundle.seccomp_of(PROFILE, machine="aarch64")
    assert arm["architectures"] == ["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"]
    assert "arch_prctl" not in json.dumps(arm)


def test_R18_the_bundle_is_roots_and_its_root_has_only_mount_points(tmp_path):
    box = tmp_path / "bundles" / "m-1"
    bundle.write(box, bundle.config(sandbox_of(env={"SECRET": "x"}), None))
    assert box.stat().st_mode & 0o777 == 0o700
    assert (box / "config.json").stat().st_mode & 0o777 == 0o600
    assert json.loads((box / "config.json").read_text())["process"]["user"]["uid"] == 61234
    rootfs = box / "rootfs"
    assert (rootfs / "tmp").stat().st_mode & 0o7777 == 0o1777  # the tmpfs takes its mode
    assert sorted(p.name for p in rootfs.iterdir() if not p.is_symlink()) == [
        "dev",
        "etc",
        "proc",
        "run",
        "sys",
        "tmp",
        "usr",
        "var",
    ]


def test_R21_the_keepers_log_never_holds_more_than_its_cap_and_one_read(tmp_path):
    path, cap = tmp_path / "m.log", 10_000
    log = shim.CappedLog(path, cap)
    largest, written = 0, 0
    for size in (1, 100, 9_000, shim.READ, 3 * shim.READ, 5, 70_000):
        log.write(b"x" * (size - 1) + b"\n")
        written += size
        largest = max(largest, path.stat().st_size)
    log.write(b"the end\n")
    log.close()
    assert largest <= cap + shim.READ
    read = logs.read(path, 1 << 20, offset=0)
    assert read.truncated and read.data.endswith(b"the end\n")
    assert read.next_offset == written + len(b"the end\n")  # offsets count every byte
    uncapped = tmp_path / "u.log"
    log = shim.CappedLog(uncapped, 0)
    log.write(b"y" * 50_000)
    log.close()
    assert uncapped.stat().st_size == 50_000
    assert path.stat().st_mode & 0o777 == 0o600


def test_R18_the_keeper_reports_a_signal_as_128_plus_it_and_a_start_that_failed():
    assert shim.status_code(7 << 8) == 7
    assert shim.status_code(9) == 137
    assert shim.START_FAILED == 125


def test_R20_a_uid_is_handed_out_again_only_once_its_members_cleanup_is_confirmed(tmp_path):
    first = 64980
    store = Store(tmp_path)
    runner = Runner(store, tmp_path, scope="r20", uids=(first, first + 1))
    store.save(Member(command_id="m-old", uid=first, state="failed", cleaned=False))
    assert runner._free_uid() == first + 1  # ended, not yet cleaned: still its
    store.save(Member(command_id="m-other", uid=first + 1, state="running"))
    assert runner._free_uid() is None  # the range is used up: a start then fails, named
    store.save(Member(command_id="m-old", uid=first, state="failed", cleaned=True))
    assert runner._free_uid() == first


def test_R19_the_ports_mapped_to_a_member_are_a_replicas_and_a_gang_masters_only():
    def spec(**payload):
        return MemberSpec.parse({"cards": [], "argv": ["x"], **payload})

    assert served_ports(spec()) == []
    assert served_ports(spec(serve={"port": 8295, "readiness_path": "/"})) == [8295]
    master = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "0"}
    assert served_ports(spec(rendezvous=master)) == [29500]
    assert served_ports(spec(rendezvous={**master, "RANK": "1"})) == []  # ranks dial it
    assert served_ports(spec(rendezvous={**master, "MASTER_PORT": "x"})) == []
    # As the console sends them: numbers.
    assert served_ports(spec(rendezvous={**master, "MASTER_PORT": 29500, "RANK": 0})) == [29500]
    assert served_ports(spec(rendezvous={**master, "MASTER_PORT": 29500, "RANK": 1})) == []


def test_R14_R17_a_containers_run_argv_drops_every_capability_and_carries_no_env(tmp_path):
    """Issue 47's R14 break (``--cap-drop ALL`` dropped) in process: the runtime's argv holds
    the wall's flags, its env only through the env file, whatever the member's env says."""
    spec = MemberSpec.parse(
        {
            "cards": [],
            "image": "busybox",
            "argv": ["sh"],
            "env": {"PATH": "/evil", "LD_PRELOAD": "/evil.so", "SECRET": "s3cr3t"},
            "pids": 40,
            "delivery": {
                "mode": "shared-mount",
                "env": {"TUNEPLANE_DATASET_X": "ds/x", "TUNEPLANE_VOLUME_Y": "vol/y"},
            },
        }
    )
    argv = containers.run_argv(
        "docker",
        member_id="m-1",
        scope="node-1",
        spec=spec,
        env_file=tmp_path / "m-1.env",
        scratch=tmp_path / "scratch",
        storage_root="/srv/tp",
        uid=61001,
    )
    joined = " ".join(argv)
    for flag in ("--cap-drop ALL", "--security-opt no-new-privileges", "--pids-limit 40"):
        assert flag in joined, argv
    assert "--user 61001:61001" in joined and f"--env-file {tmp_path / 'm-1.env'}" in joined
    assert "/srv/tp/ds/x:/srv/tp/ds/x:ro" in argv and "/srv/tp/vol/y:/srv/tp/vol/y" in argv
    assert "-v" in argv and "/srv/tp:/srv/tp" not in argv  # never the whole storage root
    assert not [part for part in argv if "s3cr3t" in part or "/evil" in part]
    assert launch.runtime_env()["PATH"] == launch.SYSTEM_PATH


def test_R18_a_member_whose_seccomp_profile_cannot_be_read_is_never_started(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.fail("as root: a runner confines members only as root")
    monkeypatch.setattr(bundle, "load_seccomp", lambda: None)
    runner = Runner(Store(tmp_path), tmp_path, scope="r18", uids=(64970, 64979))
    member = runner.start("m-1", {"cards": [], "argv": ["true"]})
    assert (member.state, member.reason) == ("failed", "start_failed")
    assert "seccomp" in member.detail and member.pid is None


@pytest.mark.parametrize("word", [None, b"0", b"1"], ids=["pipe-closed", "wrong-word", "go"])
def test_R18_the_keeper_runs_the_member_only_on_the_agents_word(tmp_path, word):
    """The keeper starts before the member's network and bundle are ready and waits on a
    pipe: the agent's word runs it; a pipe closed without it (the agent failed on the way,
    or died) ends the keeper with START_FAILED, the runtime never run."""
    runtime = tmp_path / "fake-runc"
    ran = tmp_path / "ran"
    runtime.write_text(f"#!/bin/sh\necho ran > {ran}\nexit 1\n")
    runtime.chmod(0o755)
    paths = sandbox.Paths(tmp_path)
    paths.ensure()
    paths.bundle("m-1").mkdir()
    exit_file, log_file = tmp_path / "m-1.exit", tmp_path / "m-1.log"
    reader, writer = os.pipe()
    argv = sandbox.keeper_argv(paths, "m-1", exit_file, log_file, 0, go_fd=reader)
    argv[5] = str(runtime)
    keeper = subprocess.Popen(argv, pass_fds=(reader,), env=dict(sandbox.FIXED_ENV))
    os.close(reader)
    if word is not None:
        os.write(writer, word)
    os.close(writer)
    assert keeper.wait(30) == 0
    assert exit_file.read_text() == f"{shim.START_FAILED}\n"  # the fake runtime fails
    assert ran.exists() == (word == sandbox.GO)
    assert sandbox.GO == shim.GO


# Read back whole (issue 47: what the first mutation run of bundle.py left alive).

UVM = 508


def test_R12_a_members_dev_is_exactly_its_cards_then_the_control_devices_in_order():
    assert bundle.card_devices({2, 0}, {"nvidia-uvm": UVM}) == (
        Device("/dev/nvidia0", 195, 0),
        Device("/dev/nvidia2", 195, 2),
        Device("/dev/nvidiactl", 195, 255),
        Device("/dev/nvidia-modeset", 195, 254),
        Device("/dev/nvidia-uvm", UVM, 0),
        Device("/dev/nvidia-uvm-tools", UVM, 1),
    )


def test_R12_one_card_without_uvm_has_no_uvm_devices_and_none_without_cards():
    assert bundle.card_devices([7], {}) == (
        Device("/dev/nvidia7", 195, 7),
        Device("/dev/nvidiactl", 195, 255),
        Device("/dev/nvidia-modeset", 195, 254),
    )
    assert bundle.card_devices([], {"nvidia-uvm": UVM}) == ()
    # uvm's major 0 is a major all the same (only None says the driver has none)
    assert bundle.card_devices([1], {"nvidia-uvm": 0})[-1] == Device("/dev/nvidia-uvm-tools", 0, 1)


SMALL_PROFILE = {
    "defaultAction": "SCMP_ACT_KILL_PROCESS",
    "defaultErrnoRet": 38,
    "archMap": [
        {"architecture": "SCMP_ARCH_AARCH64", "subArchitectures": ["SCMP_ARCH_ARM"]},
        {
            "architecture": "SCMP_ARCH_X86_64",
            "subArchitectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        },
    ],
    "syscalls": [
        {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["unshare", "clone", "clone3"], "action": "SCMP_ACT_ALLOW"},  # all dropped
        {
            "names": ["personality"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": 0, "value": 8, "valueTwo": 0, "op": "SCMP_CMP_EQ"}],
        },
        {"names": ["ptrace"], "action": "SCMP_ACT_ERRNO", "errnoRet": 0},
        {"names": ["arch_prctl"], "action": "SCMP_ACT_ALLOW", "includes": {"arches": ["amd64"]}},
        {"names": ["arm_only"], "action": "SCMP_ACT_ALLOW", "includes": {"arches": ["arm64"]}},
        {"names": ["no_amd64"], "action": "SCMP_ACT_ALLOW", "excludes": {"arches": ["amd64"]}},
        {"names": ["bpf"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_BPF"]}},
        {"names": ["kept"], "action": "SCMP_ACT_ALLOW", "excludes": {"caps": ["CAP_BPF"]}},
    ],
}
ADDED = [
    {"names": list(bundle.REFUSED_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": 1},
    {
        "names": ["clone"],
        "action": "SCMP_ACT_ALLOW",
        "args": [{"index": 0, "value": 0x7E020000, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}],
    },
    {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
]


def test_R18_the_seccomp_filter_is_the_profiles_rules_for_this_machine_and_a_process_without_caps():
    assert bundle.seccomp_of(SMALL_PROFILE, machine="x86_64") == {
        "defaultAction": "SCMP_ACT_KILL_PROCESS",
        "defaultErrnoRet": 38,
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": [
            {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
            {
                "names": ["personality"],
                "action": "SCMP_ACT_ALLOW",
                "args": [{"index": 0, "value": 8, "valueTwo": 0, "op": "SCMP_CMP_EQ"}],
            },
            {"names": ["ptrace"], "action": "SCMP_ACT_ERRNO", "errnoRet": 0},  # 0 is an errno
            {"names": ["arch_prctl"], "action": "SCMP_ACT_ALLOW"},
            {"names": ["kept"], "action": "SCMP_ACT_ALLOW"},
            *ADDED,
        ],
    }


def test_R18_on_arm_the_arm_rules_and_none_of_amd64s():
    filtered = bundle.seccomp_of(SMALL_PROFILE, machine="aarch64")
    assert filtered["architectures"] == ["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"]
    names = [rule["names"] for rule in filtered["syscalls"]]
    assert ["arm_only"] in names and ["no_amd64"] in names and ["arch_prctl"] not in names


def test_R18_a_profile_that_says_little_gets_errno_by_default_and_no_architectures():
    bare = {"syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW"}]}
    assert bundle.seccomp_of(bare, machine="x86_64") == {
        "defaultAction": "SCMP_ACT_ERRNO",
        "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW"}, *ADDED],
    }
    unknown = bundle.seccomp_of(SMALL_PROFILE, machine="riscv64")  # no archMap entry of its own
    assert "architectures" not in unknown
    assert bundle.seccomp_of({}, machine="x86_64") == {
        "defaultAction": "SCMP_ACT_ERRNO",
        "syscalls": ADDED,
    }


def test_R11_R18_the_process_part_of_the_config_whole():
    """Every capability set present and empty, tini's `--` before the member's argv (an argv
    that starts with `-` is the member's, never an option of its init), its uid as its group,
    no terminal, no new privileges, its open-files limit."""
    spec = bundle.config(sandbox_of(argv=("-x", "--y"), nofile=4096), None)
    assert spec["ociVersion"] == "1.0.2"
    assert spec["process"] == {
        "terminal": False,
        "user": {"uid": 61234, "gid": 61234, "additionalGids": []},
        "args": [bundle.INIT, "--", "-x", "--y"],
        "env": ["HOME=/scratch"],
        "cwd": "/var/lib/tuneplane/members/m-1",
        "capabilities": {
            "bounding": [],
            "effective": [],
            "inheritable": [],
            "permitted": [],
            "ambient": [],
        },
        "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096}],
        "noNewPrivileges": True,
    }
    assert spec["root"] == {"path": "rootfs", "readonly": True}
    assert spec["hostname"] == "m-1"


def test_R18_a_bundle_written_again_keeps_its_root_and_its_hosts_usr_links(tmp_path):
    """A replica's restart writes its bundle again over the first: the same root, 0755, the
    merged-/usr links the host has (bin → usr/bin) and none it has not."""
    box = tmp_path / "m-1"
    spec = bundle.config(sandbox_of(), None)
    bundle.write(box, spec)
    bundle.write(box, spec)
    rootfs = box / "rootfs"
    assert rootfs.stat().st_mode & 0o7777 == 0o755
    for name in bundle.USR_LINKS:
        host = Path("/") / name
        if host.is_symlink():
            assert (rootfs / name).readlink() == host.readlink(), name
        else:
            assert not (rootfs / name).exists(), name


def test_R12_R13_the_linux_part_names_its_cgroup_its_devices_and_what_it_never_reads():
    devices = (Device("/dev/nvidia3", 195, 3), Device("/dev/nvidiactl", 195, 255))
    filtered = {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": []}
    linux = bundle.config(sandbox_of(devices=devices), filtered)["linux"]
    assert linux["cgroupsPath"] == "/tuneplane/node-1/m-1"
    assert linux["devices"] == [
        {"path": "/dev/nvidia3", "type": "c", "major": 195, "minor": 3, "fileMode": 0o666,
         "uid": 0, "gid": 0},
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255, "fileMode": 0o666,
         "uid": 0, "gid": 0},
    ]  # fmt: skip
    assert linux["maskedPaths"] == bundle.MASKED and "/proc/kcore" in linux["maskedPaths"]
    assert linux["readonlyPaths"] == bundle.READ_ONLY and "/proc/sys" in linux["readonlyPaths"]
    assert linux["seccomp"] is filtered
    assert "seccomp" not in bundle.config(sandbox_of(), None)["linux"]


def tmpfs_mount(destination, size, *options):
    return {
        "destination": destination,
        "type": "tmpfs",
        "source": "tmpfs",
        "options": ["nosuid", "nodev", *options, f"size={size}"],
    }


def test_R18_R21_a_process_members_mounts_whole_in_order():
    """Fresh kernel filesystems, /usr and /etc read-only, every place it may write private
    and sized (/tmp and /var/tmp at its own size below the cap, /dev/shm too, /run small and
    noexec), its binds last — read-only where they say so."""
    mib = 1 << 20
    binds = (
        bundle.Bind("/srv/tp/ml/scratch/m-1", "/scratch"),
        bundle.Bind("/srv/tp/ml/datasets/d", "/datasets/d", read_only=True),
    )
    ro_bind = ["rbind", "ro", "nosuid", "nodev"]
    assert bundle.mounts(sandbox_of(binds=binds, tmp_bytes=64 * mib)) == [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": []},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        tmpfs_mount("/dev/shm", 64 * mib, "noexec", "mode=1777"),
        {
            "destination": "/dev/mqueue",
            "type": "mqueue",
            "source": "mqueue",
            "options": ["nosuid", "noexec", "nodev"],
        },
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", "ro"],
        },
        {
            "destination": "/sys/fs/cgroup",
            "type": "cgroup",
            "source": "cgroup",
            "options": ["nosuid", "noexec", "nodev", "relatime", "ro"],
        },
        {"destination": "/usr", "type": "bind", "source": "/usr", "options": ro_bind},
        {"destination": "/etc", "type": "bind", "source": "/etc", "options": ro_bind},
        tmpfs_mount("/tmp", 64 * mib, "mode=1777"),
        tmpfs_mount("/var/tmp", 64 * mib, "mode=1777"),
        tmpfs_mount("/run", 16 * mib, "noexec", "mode=755"),
        {
            "destination": "/scratch",
            "type": "bind",
            "source": "/srv/tp/ml/scratch/m-1",
            "options": ["rbind", "nosuid", "nodev", "rw"],
        },
        {
            "destination": "/datasets/d",
            "type": "bind",
            "source": "/srv/tp/ml/datasets/d",
            "options": ["rbind", "nosuid", "nodev", "ro"],
        },
    ]


def test_R18_R19_the_mounts_on_the_nodes_network_and_from_an_image_and_sizes_at_their_caps():
    on_host = bundle.mounts(sandbox_of(netns="host", host_root=False, tmp_bytes=1 << 40))
    sys = next(m for m in on_host if m["destination"] == "/sys")
    assert sys == {
        "destination": "/sys",
        "type": "bind",
        "source": "/sys",
        "options": ["rbind", "ro", "nosuid", "nodev"],
    }  # sysfs needs a network namespace of its own
    assert not {"/usr", "/etc"} & {m["destination"] for m in on_host}  # an image's root
    sizes = {m["destination"]: m["options"][-1] for m in on_host if m["type"] == "tmpfs"}
    assert sizes["/tmp"] == sizes["/var/tmp"] == f"size={bundle.TMP_BYTES}"
    assert sizes["/dev/shm"] == f"size={bundle.SHM_BYTES}"


def test_R12_R16_its_cgroups_limits_whole_and_none_it_was_not_given():
    devices = (Device("/dev/nvidia1", 195, 1),)
    limited = sandbox_of(devices=devices, memory_bytes=2 << 30, cpus=1.5, pids=512)
    assert bundle.resources(limited) == {
        "devices": [
            {"allow": False, "access": "rwm"},
            {"allow": True, "type": "c", "major": 195, "minor": 1, "access": "rwm"},
        ],
        "memory": {"limit": 2 << 30, "swap": 2 << 30},  # no swap beyond its memory
        "cpu": {"quota": 150_000, "period": 100_000},
        "pids": {"limit": 512},
    }
    assert bundle.resources(sandbox_of()) == {"devices": [{"allow": False, "access": "rwm"}]}


def test_R18_an_architecture_without_sub_architectures_and_one_the_agent_has_no_name_for():
    """An archMap entry may name no sub-architectures; a machine not in ARCH (riscv64) is
    matched by its own name in a rule's arches."""
    profile = {
        "archMap": [{"architecture": "SCMP_ARCH_X86_64"}],
        "syscalls": [
            {
                "names": ["riscv_only"],
                "action": "SCMP_ACT_ALLOW",
                "includes": {"arches": ["riscv64"]},
            },
            {
                "names": ["not_riscv"],
                "action": "SCMP_ACT_ALLOW",
                "excludes": {"arches": ["riscv64"]},
            },
        ],
    }
    assert bundle.seccomp_of(profile, machine="x86_64")["architectures"] == ["SCMP_ARCH_X86_64"]
    names = [rule["names"] for rule in bundle.seccomp_of(profile, machine="riscv64")["syscalls"]]
    assert ["riscv_only"] in names and ["not_riscv"] not in names
