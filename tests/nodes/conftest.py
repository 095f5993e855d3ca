import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from nodes.agent.executor import Executor
from nodes.agent.member import cgroups
from nodes.gateway import Gateway
from nodes.gateway.db_threads import DatabaseThreads
from tests.conftest import H100_DEVICES
from tests.nodes.gpu_samples import send

from .kube_replay import KubeReplay


@pytest.fixture
def replay(monkeypatch):
    """A replayed Kubernetes API serving a NodeList (no proxy between: it is local). A module
    that needs an empty one defines its own."""
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    with KubeReplay() as server:
        server.serve("GET", "/api/v1/nodes", "nodes.json")
        yield server


@pytest.fixture
def replica():
    """A gateway replica of the test's own, with two database threads even on SQLite: one
    may be held on purpose."""
    pool = ThreadPoolExecutor(2, thread_name_prefix="test-gateway-db")
    yield Gateway(name="test-gateway:8443", database=DatabaseThreads(pool=pool, control_pool=pool))
    pool.shutdown(wait=True)


@pytest.fixture
def executor(tmp_path):
    """An agent's executor with a cgroup scope of its own, whose cgroups go with the test."""
    scope = f"test-{uuid.uuid4().hex[:8]}"
    yield Executor(
        tmp_path / "state", devices=lambda: H100_DEVICES, storage_root="/srv/tp", scope=scope
    )
    for member_id in cgroups.cgroup_members(scope):
        cgroups.signal_member(None, f"{scope}/{member_id}", cgroups.SIGKILL)
        cgroups.release(f"{scope}/{member_id}")
    for path in cgroups.cgroup_paths(f"{scope}/-")[1]:
        if path.parent.exists():  # the last member's release took it already
            path.parent.rmdir()


@pytest.fixture
def sampled_node(node_fleet, gpu_node):
    """A node with eight cards whose first telemetry sample is in: what later ones are
    compared with."""
    made = gpu_node(node_fleet)
    send(made)
    return made
