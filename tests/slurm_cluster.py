"""A real one-node Slurm 22.05 cluster, with slurmrestd on loopback, for tests.

Debian's packages (``slurm-wlm slurmrestd munge``) run as root on one machine: slurmctld and
slurmd in the foreground (so each PID is ours to stop, and logs go to our files), four fake
H100 GPUs, JWT auth for the REST API. A stub would hide what matters to a client: response
shapes, auth failures, jobs that really run.
"""

import os
import pwd
import secrets
import shutil
import socket
import stat
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

API_VERSION = "v0.0.38"
# The default plugin set makes slurmrestd die with "slurm not configured with slurmdbd".
OPENAPI_PLUGINS = "openapi/v0.0.36,openapi/v0.0.37,openapi/v0.0.38"
# slurmrestd refuses to run as root or as SlurmUser; it binds, then drops to this user.
RESTD_USER = "nobody"
GPU_COUNT = 4
# Any four character devices will do when mknod is not allowed (e.g. in a container).
FALLBACK_GPU_FILES = "/dev/null,/dev/zero,/dev/full,/dev/urandom"
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_RUN_DIR = Path("/run/munge")
START_TIMEOUT = 30.0
STOP_GRACE = 10.0
JOBS_GONE_WITHIN = 10.0
LOG_TAIL_LINES = 30
REQUIRED_PROGRAMS = (
    "munge",
    "unmunge",
    "mungekey",
    "munged",
    "slurmctld",
    "slurmd",
    "slurmrestd",
    "scontrol",
    "scancel",
    "squeue",
    "sinfo",
)
# Daemons live in sbin, which a non-login PATH may lack.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])

SLURM_CONF = """\
ClusterName=ci
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=slurm
AuthType=auth/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key={root}/state/jwt_hs256.key
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
GresTypes=gpu
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 Gres=gpu:h100:{gpus} State=UNKNOWN
PartitionName={partition} Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""

GRES_CONF = """\
AutoDetect=off
NodeName={node} Name=gpu Type=h100 File={files}
"""


class SlurmStartupError(RuntimeError):
    """The cluster did not come up; the message carries the tail of the relevant logs."""


def slurm_available() -> bool:
    """Whether every Slurm and MUNGE program the cluster runs is installed."""
    return all(shutil.which(name, path=SEARCH_PATH) for name in REQUIRED_PROGRAMS)


class SlurmCluster:
    """Slurm (munged, slurmctld, slurmd, slurmrestd) laid out in ``scratch`` and run as root.

    Every run picks fresh ports and rewrites its state, so a previous run's leftovers (stale
    state, daemons still holding the usual ports, a munged already running) do not matter.
    ``scratch`` must be reachable by the users ``slurm`` and ``nobody``, so not under
    pytest's 0700 temp root.
    """

    partition = "debug"
    api_version = API_VERSION
    slurm_conf = SLURM_CONF

    def __init__(self, scratch: Path):
        self.scratch = Path(scratch).resolve()
        self.node_name = socket.gethostname().split(".")[0]
        self.env = {**os.environ, "SLURM_CONF": str(self.conf_root / "etc" / "slurm.conf")}
        self.url = ""
        self.token = ""
        self._processes: dict[str, subprocess.Popen] = {}

    def __enter__(self) -> "SlurmCluster":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def headers(self) -> dict[str, str]:
        """What slurmrestd wants on every request over TCP (only JWT auth works there)."""
        return {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": self.token}

    @property
    def conf_root(self) -> Path:
        """``scratch`` as the daemons see it (the same path here; another in a chroot)."""
        return self.scratch

    def start(self) -> None:
        """Bring every daemon up; on failure, stop those already started and re-raise."""
        if os.geteuid() != 0:
            raise SlurmStartupError("SlurmCluster needs root: its daemons switch users")
        try:
            self._lay_out()
            self._start_auth()
            self._spawn("slurmctld", ["slurmctld", "-D"])
            self._spawn("slurmd", ["slurmd", "-D"])
            self._wait_for("the node to be idle", self._node_is_idle, "slurmctld", "slurmd")
            self.token = self._mint_token()
            self._start_restd()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop what this object started, newest first (munged only if it was ours), after
        its jobs: a job's slurmstepd outlives slurmd (a test that failed mid-job left one)."""
        self._cancel_jobs()
        for name in reversed(list(self._processes)):
            _terminate(self._processes.pop(name))

    def _cancel_jobs(self) -> None:
        """Every job of this cluster cancelled and gone, or JOBS_GONE_WITHIN passed."""
        daemons = ("slurmctld", "slurmd")
        if any(
            name not in self._processes or self._processes[name].poll() is not None
            for name in daemons
        ):
            return
        subprocess.run(self._command("scancel", "--user=root"), env=self.env, capture_output=True)
        deadline = time.monotonic() + JOBS_GONE_WITHIN
        while (
            time.monotonic() < deadline
            and subprocess.run(
                self._command("squeue", "-h", "-o", "%i"),
                env=self.env,
                capture_output=True,
                text=True,
            ).stdout.strip()
        ):
            time.sleep(0.2)

    def stop_restd(self) -> None:
        """Stop slurmrestd alone: the API becomes unreachable while Slurm itself runs on."""
        _terminate(self._processes.pop("slurmrestd"))

    def scontrol(self, *args: str) -> str:
        """Run scontrol against this cluster; its stdout, or an error carrying its stderr."""
        result = subprocess.run(
            self._command("scontrol", *args), env=self.env, capture_output=True, text=True
        )
        if result.returncode:
            raise RuntimeError(f"scontrol {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def _lay_out(self) -> None:
        """Write a fresh tree: a DRAIN reason or old jobs left in the state dir would leak in."""
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.scratch.chmod(0o755)
        _require_reachable(self.scratch)
        for name in ("etc", "state", "spool", "dev", "log"):
            shutil.rmtree(self.scratch / name, ignore_errors=True)
            (self.scratch / name).mkdir()
            (self.scratch / name).chmod(0o755)
        ctld_port, slurmd_port = _free_ports(2)
        settings = {
            "node": self.node_name,
            "root": self.conf_root,
            "partition": self.partition,
            "cpus": os.cpu_count(),
            "gpus": GPU_COUNT,
            "ctld_port": ctld_port,
            "slurmd_port": slurmd_port,
        }
        _write(self.scratch / "etc" / "slurm.conf", self.slurm_conf.format(**settings))
        _write(
            self.scratch / "etc" / "gres.conf",
            GRES_CONF.format(node=self.node_name, files=self._make_gpu_devices()),
        )
        self._write_jwt_key()

    def _make_gpu_devices(self) -> str:
        """Device files for gres.conf: Slurm drops a GPU without one and the node goes INVAL."""
        try:
            for index in range(GPU_COUNT):
                os.mknod(
                    self.scratch / "dev" / f"nvidia{index}",
                    0o666 | stat.S_IFCHR,
                    os.makedev(195, index),
                )  # 195: NVIDIA's major number
        except OSError:
            return FALLBACK_GPU_FILES
        return f"{self.conf_root}/dev/nvidia[0-{GPU_COUNT - 1}]"

    def _write_jwt_key(self) -> None:
        """slurmctld signs and checks tokens with this key, and wants it to itself."""
        state = self.scratch / "state"
        key = state / "jwt_hs256.key"
        key.write_bytes(secrets.token_bytes(32))
        key.chmod(0o600)
        for path in (state, key):
            self._chown_to_slurm(path)

    def _chown_to_slurm(self, path: Path) -> None:
        shutil.chown(path, "slurm", "slurm")

    def _command(self, program: str, *args: str, daemon: bool = False) -> list[str]:
        """The argv that runs one of Slurm's programs (``daemon``: one that stays up)."""
        return [_program(program), *args]

    def _start_auth(self) -> None:
        self._start_munged_unless_usable()

    def _restd_argv(self, port: int) -> list[str]:
        return ["slurmrestd", "-u", RESTD_USER, "-s", OPENAPI_PLUGINS, f"127.0.0.1:{port}"]

    def _start_munged_unless_usable(self) -> None:
        """munged serves the whole machine: reuse one that works, else start (and own) one."""
        if _munge_works():
            return
        if not MUNGE_KEY.exists():
            subprocess.run([_program("mungekey"), "--create"], check=True, **_as_user("munge"))
        MUNGE_RUN_DIR.mkdir(exist_ok=True)
        shutil.chown(MUNGE_RUN_DIR, "munge", "munge")
        self._spawn("munged", ["munged", "--foreground"], user="munge")
        self._wait_for("munged to answer", _munge_works, "munged")

    def start_restd(self) -> None:
        """slurmrestd again, on the port it had: what a restart of the API looks like."""
        self._start_restd(int(self.url.rsplit(":", 1)[1]))

    def _start_restd(self, port: int | None = None) -> None:
        port = port or _free_ports(1)[0]
        self.url = f"http://127.0.0.1:{port}"
        self._spawn("slurmrestd", self._restd_argv(port), env={**self.env, "SLURM_JWT": "daemon"})
        self._wait_for("slurmrestd to answer ping", self._restd_answers, "slurmrestd")

    def _spawn(
        self,
        name: str,
        argv: list[str],
        *,
        user: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """Start a daemon in the foreground, its output in ``log/<name>.log``."""
        with open(self._log_path(name), "ab") as log:
            self._processes[name] = subprocess.Popen(
                self._command(*argv, daemon=True),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.scratch,
                env=env or self.env,
                **(_as_user(user) if user else {}),
            )

    def _wait_for(self, what: str, ready, *daemons: str) -> None:
        """Poll ``ready``; fail as soon as one of ``daemons`` dies, with their logs' tails."""
        deadline = time.monotonic() + START_TIMEOUT
        while not ready():
            exited = [name for name in daemons if self._processes[name].poll() is not None]
            if exited or time.monotonic() > deadline:
                problem = (
                    f"{', '.join(exited)} exited"
                    if exited
                    else f"timed out after {START_TIMEOUT:.0f} s"
                )
                raise SlurmStartupError(f"waiting for {what}: {problem}\n{self._tails(daemons)}")
            time.sleep(0.1)

    def _node_is_idle(self) -> bool:
        result = subprocess.run(
            self._command("sinfo", "-h", "-N", "-o", "%T"),
            env=self.env,
            capture_output=True,
            text=True,
        )
        return result.stdout.strip() == "idle"

    def _mint_token(self) -> str:
        output = self.scontrol("token", "username=root", "lifespan=86400")
        return output.strip().removeprefix("SLURM_JWT=")

    def _restd_answers(self) -> bool:
        request = urllib.request.Request(
            f"{self.url}/slurm/{self.api_version}/ping", headers=self.headers
        )
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                return response.status == 200
        except OSError:  # refused while binding, or an HTTP error status
            return False

    def _log_path(self, name: str) -> Path:
        return self.scratch / "log" / f"{name}.log"

    def _tails(self, names) -> str:
        paths = [self._log_path(name) for name in names]
        return "\n".join(f"--- last lines of {path} ---\n{_tail(path)}" for path in paths)


def _program(name: str) -> str:
    path = shutil.which(name, path=SEARCH_PATH)
    if path is None:
        raise SlurmStartupError(f"{name} is missing: apt-get install slurm-wlm slurmrestd munge")
    return path


def _as_user(user: str) -> dict:
    """Popen arguments that drop root for ``user`` and its primary group only."""
    return {"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []}


def _munge_works() -> bool:
    """Whether a running munged signs a credential that it then verifies."""
    credential = subprocess.run([_program("munge"), "-n"], capture_output=True)
    return (
        credential.returncode == 0
        and subprocess.run(
            [_program("unmunge")], input=credential.stdout, capture_output=True
        ).returncode
        == 0
    )


def _require_reachable(directory: Path) -> None:
    """slurmctld (user slurm) and slurmrestd (user nobody) read files under ``directory``."""
    for parent in directory.parents:
        if not parent.stat().st_mode & stat.S_IXOTH:
            raise SlurmStartupError(
                f"{directory} is out of reach of the users slurm and nobody: "
                f"{parent} is not searchable by others (o+x)"
            )


def _free_ports(count: int) -> list[int]:
    """Distinct loopback ports free right now: an earlier run may still hold 6817/6818."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def _write(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o644)


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(lines[-LOG_TAIL_LINES:])


def _terminate(process: subprocess.Popen) -> None:
    """TERM, then KILL after a grace period: slurmd can ignore TERM while registering."""
    process.terminate()
    try:
        process.wait(STOP_GRACE)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
