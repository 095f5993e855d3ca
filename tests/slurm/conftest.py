import shutil
import tempfile
from pathlib import Path

import pytest

from tests.missing_parts import skip_missing
from tests.slurm_cluster import SlurmCluster, slurm_available


@pytest.fixture(scope="session")
def slurm_cluster():
    """One real Slurm cluster for the session, stopped at its end.

    Its directory is not from tmp_path_factory: pytest keeps its temp root 0700, and slurmctld
    (user slurm) and slurmrestd (user nobody) must reach their files. It is removed after a
    clean stop and kept when start-up fails, for its logs.
    """
    if not slurm_available():
        skip_missing("Slurm", "apt-get install slurm-wlm slurmrestd munge")
    scratch = Path(tempfile.mkdtemp(prefix="slurm-cluster-"))
    with SlurmCluster(scratch) as cluster:
        yield cluster
    shutil.rmtree(scratch)
