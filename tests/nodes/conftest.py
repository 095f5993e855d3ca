from concurrent.futures import ThreadPoolExecutor

import pytest

from nodes.gateway import Gateway
from nodes.gateway.db_threads import DatabaseThreads

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
