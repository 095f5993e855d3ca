import pytest

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
