import shutil
import uuid

import pytest
from kubernetes.client import CustomObjectsApi
from kubernetes.config import new_client_from_config

from nodes.backends.kubernetes import KubernetesBackend
from tests.kube_apiserver import BUILD, CONTEXT, KubeApiServer, kube_available
from tests.missing_parts import skip_missing

from .kuberay import KubeRayStandIn


@pytest.fixture(scope="session")
def kube_server():
    """One real apiextensions-apiserver and etcd for the session (per pytest-xdist worker),
    in the machine's unstable chroot, with the RayJob CRD; stopped at its end. Its directory
    (in the chroot's /tmp) is removed after a clean stop and kept when start-up fails, for
    its logs."""
    if not kube_available():
        skip_missing("the apiextensions-apiserver and etcd (an unstable chroot)", BUILD)
    with KubeApiServer() as server:
        yield server
    shutil.rmtree(server.scratch, ignore_errors=True)


@pytest.fixture
def kube(kube_server, monkeypatch):
    """The server, reached as an operator's kubeconfig context reaches a cluster."""
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kube_server.kubeconfig))
    return kube_server


@pytest.fixture
def namespace(kube):
    """A namespace of the test's own: no other test's RayJobs in it."""
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def backend(namespace) -> KubernetesBackend:
    return KubernetesBackend.from_config({"kube_context": CONTEXT, "kuberay_namespace": namespace})


@pytest.fixture
def api(kube) -> CustomObjectsApi:
    """The tests' own client (not the backend's), for what KubeRay or a person does."""
    client = new_client_from_config(config_file=str(kube.kubeconfig), context=CONTEXT)
    yield CustomObjectsApi(client)
    client.close()


@pytest.fixture
def kuberay(api, namespace) -> KubeRayStandIn:
    return KubeRayStandIn(api, namespace)
