import shutil

import pytest

from tests.missing_parts import skip_missing
from tests.slurm24_cluster import BUILD, Slurm24Cluster, slurm24_available


@pytest.fixture(scope="session")
def slurm24_cluster():
    """One real Slurm 24.11 cluster for the session, in the machine's trixie chroot, stopped
    at its end. Its directory (in the chroot's /tmp) is removed after a clean stop and kept
    when start-up fails, for its logs."""
    if not slurm24_available():
        skip_missing("Slurm 24.11 (a trixie chroot)", BUILD)
    with Slurm24Cluster() as cluster:
        yield cluster
    shutil.rmtree(cluster.scratch)
