"""Attacks on the wall between tenants (R17, R18, R20, R21, and R11–R14 they rebuild), each
by project B's member on a real agent as root, beside project A's member: every attempt
fails, and A's secret appears nowhere in what B printed. The attacks are the review's of
issue 46 and of the review before it."""

import contextlib
import os
import subprocess
import time
from pathlib import Path

import pytest

from nodes.agent.member import cgroups, isolation
from tests.agent_members import free_port, looked_at, settled, until

from .conftest import DEVICES, KEY, SECRET

# An attempt prints "NAME: REACHED" when it worked, "NAME: denied (why)" when it did not.
ATTEMPT = """
attempt() {
  name=$1; shift
  if out=$("$@" 2>&1); then echo "$name: REACHED $out"; else echo "$name: denied ($out)"; fi
}
"""


def said(output: str, name: str) -> str:
    line = next((line for line in output.splitlines() if line.startswith(f"{name}: ")), None)
    assert line is not None, f"{name} did not run:\n{output}"
    return line


def denied(output: str, *names: str) -> None:
    for name in names:
        assert said(output, name).startswith(f"{name}: denied"), output


def test_R17_a_PATH_and_LD_PRELOAD_in_the_env_never_run_as_root(node):
    """The review's root: B's env put a dir of its own first in PATH, planted the programs the
    root wrapper ran by name (mv, mount, mkdir, setpriv, sh…) and exited; they ran as root.
    Here every planted program and a planted preload library would say their uid if run:
    none runs, in this member or in the next start on the node."""
    plant = """
mkdir -p /var/tmp/.x "$TUNEPLANE_SCRATCH_DIR/.x"
for dir in /var/tmp/.x "$TUNEPLANE_SCRATCH_DIR/.x"; do
  for name in mv mount mkdir setpriv unshare sh bash tini runc python3 id cat; do
    printf '#!/bin/sh\\necho "PLANTED $0 ran as $(/usr/bin/id -u)" >&2\\n' > "$dir/$name"
    chmod +x "$dir/$name"
  done
done
echo planted
"""
    env = {
        "PATH": f"/var/tmp/.x:{node.executor.scratch}/m-b/.x:/usr/bin:/bin",
        "LD_PRELOAD": "/var/tmp/.x/evil.so",
        "BASH_ENV": "/var/tmp/.x/sh",
        "ENV": "/var/tmp/.x/sh",
        "IFS": "/",
        "PYTHONPATH": "/var/tmp/.x",
        "GCONV_PATH": "/var/tmp/.x",
        "LD_LIBRARY_PATH": "/var/tmp/.x",
    }
    output, ended = node.attack(plant, env=env)
    assert "planted" in output and ended.exit_code == 0, output
    # The next start on the node, and a stop of it, with the same env.
    node.start("m-b2", script="exec sleep 30", env=env)
    node.clean("m-b2")
    output = output + node.output("m-b2")
    assert "ran as 0" not in output, output
    assert "PLANTED" not in output.replace("PLANTED $0", ""), output


def test_R11_R18_another_members_process_env_and_signals_are_out_of_reach(node):
    a = node.victim()
    a_pid = node.host_pid("m-a", a.uid)
    assert SECRET in Path(f"/proc/{a_pid}/environ").read_text()  # there, to be read by root
    script = ATTEMPT + (
        f"attempt a-environ cat /proc/{a_pid}/environ\n"
        f"attempt a-signal kill -0 {a_pid}\n"
        f"attempt a-ptrace python3 -c 'import ctypes,sys; "
        f"sys.exit(ctypes.CDLL(None).ptrace(16, {a_pid}, 0, 0) != 0)'\n"
        "attempt any-environ sh -c 'cat /proc/[0-9]*/environ | grep -a KEY='\n"
        "echo processes: $(ls -d /proc/[0-9]* | wc -l)\n"
    )
    output, _ = node.attack(script)
    denied(output, "a-environ", "a-signal", "a-ptrace", "any-environ")
    assert int(output.split("processes: ")[1].split()[0]) < 6, output  # its own PID namespace
    assert SECRET not in output


def test_R11_R18_the_node_key_state_dir_and_other_members_files_are_not_there(node):
    node.victim()
    state, scratch = node.directory, node.executor.scratch
    script = ATTEMPT + (
        f"attempt node-key cat {state}/node.key\n"
        f"attempt state-dir ls {state}\n"
        f"attempt payloads sh -c 'cat {state}/commands/*.json'\n"
        f"attempt a-log cat {state}/logs/m-a.log\n"
        f"attempt a-scratch cat {scratch}/m-a/secret\n"
        "attempt root-home ls /root\n"
        "attempt var-lib ls /var/lib\n"
        "attempt own-scratch sh -c 'echo mine > \"$TUNEPLANE_SCRATCH_DIR/mine\" && echo ok'\n"
    )
    output, _ = node.attack(script)
    denied(output, "node-key", "payloads", "a-log", "a-scratch", "root-home", "var-lib")
    # Of the state dir, only the way to its own scratch dir is there.
    assert said(output, "state-dir") == "state-dir: REACHED members", output
    assert said(output, "own-scratch").startswith("own-scratch: REACHED"), output
    assert SECRET not in output and KEY.decode() not in output


def test_R12_R18_another_cards_device_file_is_neither_there_nor_makeable(node):
    node.victim()  # holds card 0
    script = ATTEMPT + (
        "attempt other-card sh -c 'exec 3<>/dev/nvidia0'\n"
        "attempt make-device mknod /dev/nvidia0 c 195 0\n"
        'attempt make-in-scratch mknod "$TUNEPLANE_SCRATCH_DIR/n0" c 195 0\n'
        "echo devices: $(ls /dev | tr '\\n' ' ')\n"
        # Its own card is there and allowed: no driver on this machine answers (ENXIO).
        "attempt own-card sh -c 'exec 3<>/dev/nvidia1'\n"
    )
    output, _ = node.attack(script)
    denied(output, "other-card", "make-device", "make-in-scratch")
    devices = output.split("devices: ")[1].split("\n")[0].split()
    assert "nvidia1" in devices and "nvidia0" not in devices, devices
    assert not [name for name in devices if name.startswith("nvidia") and name[6:].isdigit()][1:]
    assert "No such device or address" in said(output, "own-card"), output


def test_R12_a_member_without_cards_has_no_card_at_all(node):
    """The break issue 47 found: devices confined only when a member holds cards."""
    script = ATTEMPT + (
        "attempt card-0 sh -c 'exec 3<>/dev/nvidia0'\n"
        "attempt control sh -c 'exec 3<>/dev/nvidiactl'\n"
        "echo devices: $(ls /dev | tr '\\n' ' ')\n"
    )
    output, _ = node.attack(script, cards=[])
    denied(output, "card-0", "control")
    assert "nvidia" not in said(output, "devices"), output


def test_R13_R18_a_member_cannot_leave_its_cgroup_or_see_anothers(node):
    node.victim()
    script = ATTEMPT + (
        "attempt leave-memory sh -c 'echo $$ > /sys/fs/cgroup/memory/cgroup.procs'\n"
        "attempt leave-pids sh -c 'echo $$ > /sys/fs/cgroup/pids/cgroup.procs'\n"
        "attempt raise-limit sh -c 'echo max > /sys/fs/cgroup/pids/pids.max'\n"
        "echo cgroups: $(ls /sys/fs/cgroup/memory /sys/fs/cgroup/pids | tr '\\n' ' ')\n"
    )
    output, _ = node.attack(script, pids=64)
    denied(output, "leave-memory", "leave-pids", "raise-limit")
    assert "m-a" not in said(output, "cgroups") and "attack-" not in said(output, "cgroups")


def test_R12_R13_forking_stops_at_the_pids_limit_and_a_fork_loop_dies_with_the_cleanup(node):
    """A fork loop racing the kill (issue 47's R13 break): after cleanup, nothing of its uid
    runs on the node."""
    loop = (
        "python3 -c '\n"
        "import os, time\n"
        "n = 0\n"
        "for _ in range(100):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(300)\n"
        "        os._exit(0)\n"
        "    n += 1\n"
        'print("children:", n, flush=True)\n'
        "'\n"
        "while :; do (sleep 300 &) 2>/dev/null; done\n"
    )
    member = node.start("m-b", script=loop, pids=40)
    deadline = time.monotonic() + 20
    while "children:" not in node.output("m-b"):
        assert time.monotonic() < deadline, node.output("m-b")
        time.sleep(0.1)
    assert int(node.output("m-b").split("children: ")[1].split()[0]) < 40
    assert len(cgroups.cgroup_pids(node.executor.cgroup("m-b"))) <= 40
    cleaned = node.clean("m-b")
    assert cleaned.cleaned, cleaned
    assert member.uid not in isolation.uids_running()


def test_R18_the_node_root_is_read_only_and_daemons_die_with_the_member(node):
    script = ATTEMPT + (
        "attempt write-etc sh -c 'echo x >> /etc/passwd'\n"
        "attempt write-usr sh -c 'echo x > /usr/bin/planted'\n"
        "attempt write-root sh -c 'echo x > /planted'\n"
        "setsid sh -c 'exec sleep 600' </dev/null >/dev/null 2>&1 &\n"
        "nohup sleep 600 </dev/null >/dev/null 2>&1 &\n"
        "echo daemons started\n"
    )
    output, ended = node.attack(script)
    denied(output, "write-etc", "write-usr", "write-root")
    assert "daemons started" in output and not Path("/usr/bin/planted").exists()
    # Its PID 1 ended, so did everything in its PID namespace; the cleanup finds nothing.
    deadline = time.monotonic() + 10
    while cgroups.live_pids(node.executor.cgroup("m-b")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ended.uid not in isolation.uids_running()
    assert node.clean("m-b").cleaned


def test_R18_no_new_user_namespace_no_capabilities_no_new_privileges(node):
    script = ATTEMPT + (
        "attempt unshare-user unshare -Ur id\n"
        "attempt unshare-net unshare -rn id\n"
        "attempt mount mount -t tmpfs none /tmp\n"
        "attempt keyctl python3 -c 'import ctypes,sys; "
        "sys.exit(ctypes.CDLL(None).syscall(250, 0, 0, 0, 0, 0) == -1)'\n"
        "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status\n"
        "echo uid: $(id -u) gid: $(id -g) groups: $(id -G)\n"
    )
    output, _ = node.attack(script)
    denied(output, "unshare-user", "unshare-net", "mount", "keyctl")
    for line in ("CapEff:\t0000000000000000", "CapBnd:\t0000000000000000", "NoNewPrivs:\t1"):
        assert line in output, output
    assert "Seccomp:\t2" in output, output
    uid = next(m.uid for m in node.executor.known() if m.command_id == "m-b")
    assert f"uid: {uid} gid: {uid} groups: {uid}" in output, output


def test_R20_a_reused_uid_finds_nothing_of_the_last_tenant(node):
    """The review's: A's job wrote a 0600 file in /var/tmp and a 0600 SysV shm segment and
    ended; B's next job got the same uid and read both. A range of one uid makes B's the
    same; A leaves files in every writable place and IPC of each kind."""
    leave = (
        "umask 077\n"
        'for dir in /tmp /var/tmp /dev/shm /run "$TUNEPLANE_SCRATCH_DIR"; do\n'
        '  echo "$KEY" > "$dir/left-by-a" && echo "left in $dir"\n'
        "done\n"
        "ipcmk -M 4096 -p 0600 && ipcmk -Q -p 0600 && ipcmk -S 1 -p 0600\n"
        "python3 -c 'import os; os.mkfifo(\"/tmp/fifo\")'\n"
    )
    node.executor.runner.uids = (node.uids[0], node.uids[0])
    a_output, a = node.attack(leave, member_id="m-a", env={"KEY": SECRET})
    assert "left in /var/tmp" in a_output and a.exit_code == 0, a_output
    assert node.clean("m-a").cleaned
    look = ATTEMPT + (
        'for dir in /tmp /var/tmp /dev/shm /run "$TUNEPLANE_SCRATCH_DIR/.."; do\n'
        '  attempt "read-$dir" sh -c "cat $dir/left-by-a"\n'
        "done\n"
        "echo ipc: $(ipcs -m -q -s | grep -c 0x)\n"
        "echo sysvipc: $(cat /proc/sysvipc/shm /proc/sysvipc/msg /proc/sysvipc/sem | wc -l)\n"
    )
    b_output, b = node.attack(look, member_id="m-b")
    assert b.uid == a.uid, (a.uid, b.uid)  # the same uid, handed out again after cleanup
    assert SECRET not in b_output, b_output
    for line in b_output.splitlines():
        assert "REACHED" not in line, b_output
    assert "ipc: 0" in b_output and "sysvipc: 3" in b_output, b_output  # the three headers


def test_R20_a_uid_is_not_handed_out_while_a_process_of_it_runs(node):
    first = node.uids[0]
    stray = subprocess.Popen(
        ["/usr/bin/setpriv", f"--reuid={first}", f"--regid={first}", "--clear-groups"]
        + ["sleep", "30"]
    )
    try:
        time.sleep(0.2)
        member = node.start("m-c", argv=["sleep", "30"])
        assert member.uid == first + 1  # the range's first still runs something
    finally:
        stray.kill()
        stray.wait()


def test_R11_R18_the_hosts_ipc_and_other_tenants_are_not_listed(node):
    made = subprocess.run(
        ["/usr/bin/ipcmk", "-M", "4096", "-p", "0644"], capture_output=True, text=True, check=True
    )
    shm_id = made.stdout.split()[-1]
    try:
        output, _ = node.attack("cat /proc/sysvipc/shm; ipcs -m; echo host: $(hostname)")
        assert f" {shm_id} " not in output and "host: m-b" in output, output
    finally:
        subprocess.run(["/usr/bin/ipcrm", "-m", shm_id], check=False)


LOG_CAP = 1 << 20


def test_R21_a_log_flood_never_holds_more_than_its_cap_and_one_read(node):
    """400 MB written in 2 s once reached 221 MB on disk against an 8 MiB cap: here 200 MiB
    are written against 1 MiB, and the log is measured all along."""
    flood = "head -c 209715200 /dev/zero | tr '\\0' 'x'; echo; echo flood-done"
    node.start("m-b", script=flood, log_bytes=LOG_CAP)
    log = node.directory / "logs" / "m-b.log"
    largest = 0
    while looked_at(node.executor, "m-b").state == "running":
        if log.exists():
            largest = max(largest, log.stat().st_size)
        time.sleep(0.002)
    largest = max(largest, log.stat().st_size)
    assert largest <= LOG_CAP + 64 * 1024, largest
    assert node.output("m-b").rstrip().endswith("flood-done")
    read = node.executor.log_read("m-b", 1 << 20, offset=0)
    assert read.truncated and read.offset > 200 * (1 << 20) - LOG_CAP  # offsets count it all


@pytest.mark.parametrize("grace", [2])
def test_R18_a_stop_reaches_the_member_through_its_init_and_is_recorded(node, grace):
    """A member's own PID 1 ignores SIGTERM from outside its namespace; under tini it gets it,
    and its keeper records the exit its trap chose."""
    node.start("m-b", script="trap 'echo got-term; exit 7' TERM; sleep 300 & wait", cards=[])
    time.sleep(0.5)
    node.executor.accept("s-b", "stop", {"member": "m-b", "grace_seconds": grace})
    ended = settled(node.executor, "m-b", timeout=grace + 10)
    assert "got-term" in node.output("m-b") and ended.exit_code == 7, node.output("m-b")


def runtime_init_in(node, member_id: str, within: float) -> None:
    """Waits up to ``within`` s for the runtime's init (``runc:[2:INIT]``, before it runs
    tini) in the member's cgroup."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for pid in cgroups.cgroup_pids(node.executor.cgroup(member_id)):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().startswith("runc:"):
                    return
        time.sleep(0.0005)


def test_R10_a_member_stopped_while_its_runtime_starts_it_ends_stopped_never_start_failed(node):
    """A stop accepted right after the start races the runtime: its SIGTERM may reach runc's
    own init, whose ``runc run`` then fails and the keeper records 125 (START_FAILED), the
    code the console reads as the machine's failure to start it (H1). That end is the
    stop's: 143, stopped. Ten rounds — stops at once, at small delays, and at the moment
    runc's init is seen in the member's cgroup, the window itself, which some round must
    have hit (the runtime's words in its log)."""
    ends = []
    for round_, delay in enumerate((0, 0.005, 0.01, 0.02, 0.03, 0.04, 0.06, None, None, None)):
        member_id = f"m-b{round_}"
        node.start(member_id, script="exec sleep 300")
        if delay is None:
            runtime_init_in(node, member_id, within=2)
        else:
            time.sleep(delay)
        node.executor.accept(f"s-{member_id}", "stop", {"member": member_id, "grace_seconds": 1})
        ended = settled(node.executor, member_id, timeout=20)
        ends.append((delay, ended.exit_code, ended.reason, node.output(member_id)[-200:]))
        assert node.clean(member_id).cleaned
    assert [end for end in ends if "runc run failed" in end[3]], ends
    # The SIGTERM reached it, or runc's init, even when it was sent before anything of the
    # member was in its cgroup: never 125, and never a grace run out to SIGKILL (137).
    assert {(code, reason) for _, code, reason, _ in ends} == {(143, "stopped")}, ends


def test_R18_memory_over_its_limit_ends_oom(node):
    hog = "python3 -c 'b = bytearray(400 * 1024 * 1024); print(len(b))'"
    output, ended = node.attack(hog, memory_bytes=64 * 1024 * 1024, cards=[])
    assert ended.reason == "oom", (ended.reason, ended.exit_code, output)


def test_R18_what_a_member_is_confined_by_is_reported(node):
    member = node.start("m-b", argv=["sleep", "5"], cards=[DEVICES[2]], pids=30)
    assert member.sandbox.endswith(("runc", "crun")) and member.uid in range(
        node.uids[0], node.uids[1] + 1
    )
    for said_ in ("uid", "no capabilities", "seccomp", "its cards only", "pids 30"):
        assert said_ in member.confinement, member.confinement


def test_R21_a_scratch_and_tmp_flood_get_ENOSPC_and_the_node_holds_at_most_their_size(node):
    """300 MB once went into a 50 MiB scratch before the agent noticed, and 150 MB into
    /var/tmp uncounted: here each place is a filesystem of its size."""
    limit = 32 << 20
    flood = (
        'for dir in "$TUNEPLANE_SCRATCH_DIR" /tmp /var/tmp /dev/shm; do\n'
        '  head -c 104857600 /dev/zero > "$dir/flood" 2>/dev/null; echo "$dir: $?"\n'
        '  echo "$dir holds $(du -k "$dir/flood" | cut -f1) KiB"\n'
        "done\n"
        'df -k "$TUNEPLANE_SCRATCH_DIR" /tmp | tail -n +2\n'
    )
    node.start("m-b", script=flood + "sleep 300", scratch_bytes=limit, memory_bytes=1 << 30)
    deadline = time.monotonic() + 60
    while "/dev/shm holds" not in node.output("m-b"):
        assert time.monotonic() < deadline, node.output("m-b")
        time.sleep(0.2)
    output = node.output("m-b")
    for place in ("/tmp", "/var/tmp", "/dev/shm"):
        held = int(output.split(f"{place} holds ")[1].split()[0])
        assert held * 1024 <= limit, output  # ENOSPC at its size, never 100 MB
        assert f"{place}: 1" in output, output
    image = node.directory / "scratch-images" / "m-b.img"
    assert image.stat().st_blocks * 512 <= limit, image.stat()
    member = looked_at(node.executor, "m-b")
    assert member.state == "running" and "scratch 32 MiB ext4" in member.confinement
    assert node.clean("m-b").cleaned
    assert not image.exists() and not (node.executor.scratch / "m-b").exists()


def test_R14_R17_a_symlink_planted_as_its_script_is_never_written_through(node, tmp_path):
    """The earlier review's: a replica's script is written again at each restart, once into
    its scratch dir, where the member had planted ``script.sh`` as a link to a root file.
    Its script is the bundle's now, root's; whatever it plants is left as it is."""
    target = Path("/var/tmp") / f"root-only-{node.uids[0]}"
    target.write_text("root's\n")
    os.chmod(target, 0o600)
    plant = (
        f'ln -sf {target} "$TUNEPLANE_SCRATCH_DIR/script.sh"; '
        f'ln -sf {target} "$TUNEPLANE_SCRATCH_DIR/../script.sh" 2>/dev/null; echo planted; exit 1'
    )
    try:
        node.start("m-b", script=plant, serve={"port": free_port(), "readiness_path": "/"})
        until("restarted", lambda: looked_at(node.executor, "m-b").restarts >= 1, timeout=30)
        assert node.output("m-b").count("planted") >= 1
        assert target.read_text() == "root's\n"
        assert not (node.executor.runner.sandbox.bundle("m-b") / "script.sh").is_symlink()
    finally:
        target.unlink(missing_ok=True)
