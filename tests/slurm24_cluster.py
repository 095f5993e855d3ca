"""A real one-node Slurm 24.11 cluster, with slurmrestd serving API v0.0.40 to v0.0.42 on
loopback, for tests: Debian trixie's packages in a chroot.

The chroot is tools/slurm-24.11-chroot's, built once per machine from Debian's package
registry (``.ci/run`` builds it) and only read here: each cluster lays its files out in a
directory of its own under the chroot's /tmp, takes free ports and runs its daemons in the
chroot, so it runs beside tests/slurm_cluster.py's 22.05 cluster (and another run's clusters)
sharing no port, state dir or key. What differs from 22.05, each found by running it:

- auth/slurm (a key beside slurm.conf, SlurmUser's, 0600) instead of MUNGE: no munged to
  share with the machine's, and none to start;
- the JWT plugin is a package of its own (slurm-wlm-jwt-plugin), only recommended;
- slurmrestd's default plugins want slurmdbd: ``-s openapi/slurmctld`` serves every data
  parser the build has (v0.0.40, v0.0.41, v0.0.42);
- slurmd reads /proc: each daemon runs in a mount namespace of its own with /proc and /sys
  mounted in the chroot, gone with it, so the shared chroot never keeps a mount.
"""

import os
import shutil
import tempfile
from pathlib import Path

from tests.slurm_cluster import SEARCH_PATH, SLURM_CONF, SlurmCluster, SlurmStartupError

CHROOT = Path(os.environ.get("TUNEPLANE_SLURM24_ROOT", "/var/cache/tuneplane/slurm-24.11"))
# tools/slurm-24.11-chroot writes it last: a chroot without it is half built.
COMPLETE = ".tuneplane-complete"
BUILD = "apt-get install debootstrap && tools/slurm-24.11-chroot"
API_VERSIONS = ("v0.0.40", "v0.0.41", "v0.0.42")
RESTD_USER = "nobody"
# Run a daemon in the chroot, in a mount namespace of its own: $0 the chroot, "$@" its argv.
IN_CHROOT = 'mount -t proc proc "$0/proc" && mount --rbind /sys "$0/sys" && exec chroot "$0" "$@"'
AUTH_MUNGE = "AuthType=auth/munge\n"
AUTH_SLURM = "AuthType=auth/slurm\nCredType=cred/slurm\n"
SLURM24_CONF = SLURM_CONF.replace("ClusterName=ci\n", "ClusterName=ci24\n").replace(
    AUTH_MUNGE, AUTH_SLURM
)


def slurm24_available(root: Path = CHROOT) -> bool:
    """Whether the chroot is built and this machine has what enters it."""
    return (root / COMPLETE).is_file() and all(
        shutil.which(name, path=SEARCH_PATH) for name in ("unshare", "chroot")
    )


class Slurm24Cluster(SlurmCluster):
    """SlurmCluster's daemons, in the chroot at ``root``; its scratch dir is made there."""

    api_version = API_VERSIONS[-1]
    slurm_conf = SLURM24_CONF

    def __init__(self, root: Path = CHROOT):
        self.root = Path(root).resolve()
        super().__init__(Path(tempfile.mkdtemp(prefix="tuneplane-slurm24-", dir=self.root / "tmp")))

    @property
    def conf_root(self) -> Path:
        return Path("/") / self.scratch.relative_to(self.root)

    @property
    def job_dir(self) -> str:
        """A working directory for jobs, as the chroot's jobs see it."""
        return str(self.conf_root / "work")

    def _lay_out(self) -> None:
        super()._lay_out()
        work = self.scratch / "work"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        work.chmod(0o1777)

    def _command(self, program: str, *args: str, daemon: bool = False) -> list[str]:
        inside = next(
            (
                f"/usr/{d}/{program}"
                for d in ("sbin", "bin")
                if (self.root / f"usr/{d}/{program}").exists()
            ),
            None,
        )
        if inside is None:
            raise SlurmStartupError(
                f"{program} is missing from {self.root}: rebuild it with {BUILD}"
            )
        if daemon:
            unshare = ["unshare", "--mount", "--propagation", "private", "--"]
            return [*unshare, "sh", "-c", IN_CHROOT, str(self.root), inside, *args]
        return [shutil.which("chroot", path=SEARCH_PATH), str(self.root), inside, *args]

    def _chown_to_slurm(self, path: Path) -> None:
        """To the chroot's user slurm, by its ids there (the machine may have none)."""
        for line in (self.root / "etc" / "passwd").read_text().splitlines():
            name, _, uid, gid, *_ = line.split(":")
            if name == "slurm":
                os.chown(path, int(uid), int(gid))
                return
        raise SlurmStartupError(f"{self.root} has no user slurm: rebuild it with {BUILD}")

    def _start_auth(self) -> None:
        """auth/slurm's key, read by slurmctld and slurmd (and scontrol, as root)."""
        key = self.scratch / "etc" / "slurm.key"
        key.write_bytes(os.urandom(64))
        key.chmod(0o600)
        self._chown_to_slurm(key)

    def _restd_argv(self, port: int) -> list[str]:
        return ["slurmrestd", "-u", RESTD_USER, "-s", "openapi/slurmctld", f"127.0.0.1:{port}"]
