"""What the Kubernetes backend's tests share: the replayed API's paths, a job to submit, the
client kept off any proxy, and ways to reach a replay server."""

import dataclasses
import socket

import pytest

from nodes.backends.base import JobSpec
from nodes.backends.kubernetes import KubernetesBackend

from .kube_replay import RESPONSES

NODES = "/api/v1/nodes"
RAYJOBS = "/apis/ray.io/v1/namespaces/ml-jobs/rayjobs"
RAYJOB = f"{RAYJOBS}/llama-sft-7b-x9k2p"
TOKEN = "eyJhbGciOiJSUzI1NiJ9.replay-test-token.c2lnbmF0dXJl"  # distinctive, to look for leaks
TOKEN_ENV = "TUNEPLANE_TOKEN_TEST_KUBE_TOKEN"
SHORT_TIMEOUT = (0.5, 0.5)
H100 = "NVIDIA-H100-80GB-HBM3"
SFT_JOB = JobSpec(
    name="Llama SFT 7B", script="python train.py --epochs 3", series=H100, cards=8, nodes=2
)
KEYED_JOB = dataclasses.replace(SFT_JOB, key="tp-0123456789ab")


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    """The client takes HTTP(S)_PROXY from the environment; the replay server is local."""
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)


def backend_at(url: str, **config) -> KubernetesBackend:
    return KubernetesBackend.from_config(
        {"kube_api_url": url, "kuberay_namespace": "ml-jobs", **config}
    )


def replay_file(name: str) -> str:
    return (RESPONSES / name).read_text()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
