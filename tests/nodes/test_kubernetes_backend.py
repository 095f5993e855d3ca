"""Nodes (read()), credentials and transport, against REPLAYED responses
(tests/nodes/kube_replay.py): a node list needs the full kube-apiserver, which Debian does
not package (its ``kubernetes`` source is cut down to kubectl).

``KubeReplay`` serves stored responses in the Kubernetes API's own formats to the official
client, so what is proved here is our mapping, our requests and our error messages. The node
fixtures are checked against the Node schema of the API the client ships
(tests/nodes/test_kube_replay_schema.py), so a fixture no real server would send fails the
suite; RayJobs are proven against a real API server in tests/kube.
"""

import dataclasses
import json
import socket
import threading

import pytest
from kubernetes.client import Configuration

from nodes.backends.base import BackendError, OutcomeUnknown
from nodes.backends.kubernetes import CORDON_REASON, KubernetesBackend
from nodes.choices import SchedulingState

from .kube_backend import (  # noqa: F401 -- no_proxy: an autouse fixture
    H100,
    KEYED_JOB,
    NODES,
    RAYJOB,
    RAYJOBS,
    SFT_JOB,
    SHORT_TIMEOUT,
    TOKEN,
    TOKEN_ENV,
    backend_at,
    free_port,
    no_proxy,
    replay_file,
)
from .kube_replay import KubeReplay


@pytest.fixture
def replay():
    """A replayed API that serves nothing until the test says what."""
    with KubeReplay() as server:
        yield server


# read()


def test_read_maps_each_node_to_a_machine(replay):
    replay.serve("GET", NODES, "nodes.json")

    machines = {m.name: m for m in backend_at(replay.url).read()}

    assert list(machines) == [
        "gpu-h100-01",
        "gpu-h100-02",
        "gpu-a100-07",
        "gpu-l4-03",
        "cpu-system-01",
    ]
    ready = machines["gpu-h100-01"]
    assert ready.cards == [{"name": H100, "count": 8}]
    assert (ready.state, ready.reason, ready.cards_used) == (SchedulingState.SCHEDULABLE, "", 0)
    assert ready.detail == {"gpu_capacity": 8, "gpu_allocatable": 8}


def test_an_unschedulable_node_is_a_cordon_the_console_did_not_make(replay):
    replay.serve("GET", NODES, "nodes.json")

    machines = {m.name: m for m in backend_at(replay.url).read()}

    cordoned = machines["gpu-h100-02"]
    assert (cordoned.state, cordoned.reason) == (SchedulingState.CORDONED, CORDON_REASON)
    # One GPU failed its health check: the device plugin no longer offers it.
    assert cordoned.cards == [{"name": H100, "count": 7}]
    assert cordoned.detail == {"gpu_capacity": 8, "gpu_allocatable": 7}


def test_a_node_not_ready_is_gone_in_the_kubelets_words(replay):
    replay.serve("GET", NODES, "nodes.json")

    machines = {m.name: m for m in backend_at(replay.url).read()}

    lost = machines["gpu-a100-07"]
    assert lost.state == SchedulingState.GONE
    assert lost.reason == "Kubelet stopped posting node status."
    assert lost.cards == [{"name": "NVIDIA-A100-SXM4-80GB", "count": 4}]


def test_gpus_without_a_product_label_show_as_unmapped_and_cpu_nodes_have_no_cards(replay):
    replay.serve("GET", NODES, "nodes.json")

    machines = {m.name: m for m in backend_at(replay.url).read()}

    assert machines["gpu-l4-03"].cards == [{"name": "nvidia.com/gpu", "count": 2}]
    cpu = machines["cpu-system-01"]
    assert (cpu.cards, cpu.state) == ([], SchedulingState.SCHEDULABLE)
    assert cpu.detail == {"gpu_capacity": 0, "gpu_allocatable": 0}


def test_gpus_missing_from_allocatable_are_counted_from_capacity(replay):
    nodes = json.loads(replay_file("nodes.json"))
    del nodes["items"][3]["status"]["allocatable"]["nvidia.com/gpu"]
    replay.serve("GET", NODES, nodes)

    l4 = backend_at(replay.url).read()[3]

    assert l4.cards == [{"name": "nvidia.com/gpu", "count": 2}]
    assert l4.detail == {"gpu_capacity": 2, "gpu_allocatable": 0}


def test_a_node_without_a_ready_condition_is_gone(replay):
    nodes = json.loads(replay_file("nodes.json"))
    nodes["items"][4]["status"]["conditions"] = []  # as when a node has just registered
    replay.serve("GET", NODES, nodes)

    cpu = backend_at(replay.url).read()[4]

    assert (cpu.state, cpu.reason) == (
        SchedulingState.GONE,
        "Kubernetes reports no Ready condition",
    )


def test_a_node_list_the_client_cannot_decode_is_a_backend_error(replay):
    nodes = json.loads(replay_file("nodes.json"))
    del nodes["items"][0]["status"]["conditions"][0]["type"]
    replay.serve("GET", NODES, nodes)

    with pytest.raises(BackendError, match="node list the client cannot read"):
        backend_at(replay.url).read()


# Credentials


def test_a_token_from_the_environment_is_read_at_call_time_and_sent_as_bearer(replay, monkeypatch):
    replay.serve("GET", NODES, "nodes.json")
    backend = backend_at(replay.url, kube_token_env=TOKEN_ENV)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)

    backend.read()

    assert replay.requests[-1].headers["authorization"] == f"Bearer {TOKEN}"
    assert TOKEN not in repr(backend)


def test_a_token_from_a_file_is_sent_as_bearer(replay, secrets_dir):
    replay.serve("GET", NODES, "nodes.json")
    token_file = secrets_dir / "token"
    token_file.write_text(TOKEN + "\n")

    backend_at(replay.url, kube_token_file=str(token_file)).read()

    assert replay.requests[-1].headers["authorization"] == f"Bearer {TOKEN}"


def test_an_unset_token_variable_is_named_and_nothing_is_sent(replay, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)

    with pytest.raises(BackendError, match=f"{TOKEN_ENV} .config.kube_token_env"):
        backend_at(replay.url, kube_token_env=TOKEN_ENV).read()
    assert replay.requests == []


def test_401_says_authentication_failed_and_never_shows_the_token(replay, monkeypatch):
    replay.serve("GET", NODES, "status-401.json", status=401)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)

    with pytest.raises(BackendError) as caught:
        backend_at(replay.url, kube_token_env=TOKEN_ENV).read()

    message = str(caught.value)
    assert "401" in message and "authentication failed" in message
    assert "kube_token_env" in message
    assert TOKEN not in message and TOKEN not in str(caught.value.__cause__)


def test_a_kubeconfig_context_is_loaded_without_touching_the_default_config(
    replay, tmp_path, monkeypatch
):
    replay.serve("GET", NODES, "nodes.json")
    elsewhere = f"http://127.0.0.1:{free_port()}"
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "replay", "cluster": {"server": replay.url}},
                    {"name": "elsewhere", "cluster": {"server": elsewhere}},
                ],
                "users": [{"name": "console", "user": {"token": TOKEN}}],
                "contexts": [
                    {"name": "lab", "context": {"cluster": "replay", "user": "console"}},
                    {"name": "other", "context": {"cluster": "elsewhere", "user": "console"}},
                ],
                "current-context": "other",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    default_host = Configuration.get_default_copy().host

    machines = KubernetesBackend.from_config({"kube_context": "lab"}).read()

    assert len(machines) == 5
    assert replay.requests[-1].headers["authorization"] == f"Bearer {TOKEN}"
    assert Configuration.get_default_copy().host == default_host != replay.url


def test_an_unknown_kubeconfig_context_is_a_backend_error(tmp_path, monkeypatch):
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        json.dumps(
            {"apiVersion": "v1", "kind": "Config", "clusters": [], "users": [], "contexts": []}
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))

    with pytest.raises(BackendError, match="kubeconfig context 'lab' cannot be used"):
        KubernetesBackend.from_config({"kube_context": "lab"}).read()


# Failures


def test_500_is_a_backend_error_in_the_api_servers_words(replay):
    replay.serve("GET", NODES, "status-500.json", status=500)

    with pytest.raises(BackendError) as caught:
        backend_at(replay.url).read()

    assert "500" in str(caught.value)
    assert "etcdserver: request timed out" in str(caught.value)


def test_a_closed_port_is_a_backend_error():
    url = f"http://127.0.0.1:{free_port()}"
    backend = dataclasses.replace(backend_at(url), timeout=SHORT_TIMEOUT)

    with pytest.raises(BackendError, match=f"Kubernetes API at {url} did not answer"):
        backend.read()


def test_a_server_that_never_answers_is_a_backend_error():
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts in the kernel, says nothing
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        backend = dataclasses.replace(backend_at(url), timeout=SHORT_TIMEOUT)

        with pytest.raises(BackendError, match="did not answer.*timed out"):
            backend.read()


def test_a_submit_never_sent_fails_and_one_unanswered_is_an_unknown_outcome():
    """A closed port: KubeRay cannot have the job. A server that took the request and never
    answered: it may have, and the handover is resumed rather than failed."""
    refused = dataclasses.replace(
        backend_at(f"http://127.0.0.1:{free_port()}"), timeout=SHORT_TIMEOUT
    )
    with pytest.raises(BackendError) as never_sent:
        refused.submit(KEYED_JOB)
    assert not isinstance(never_sent.value, OutcomeUnknown)

    with socket.create_server(("127.0.0.1", 0)) as silent:
        backend = dataclasses.replace(
            backend_at(f"http://127.0.0.1:{silent.getsockname()[1]}"), timeout=SHORT_TIMEOUT
        )
        with pytest.raises(OutcomeUnknown, match="did not answer"):
            backend.submit(KEYED_JOB)


def test_the_client_does_not_retry_a_dropped_connection():
    connections = []
    with socket.create_server(("127.0.0.1", 0)) as rude:

        def hang_up():
            while True:
                try:
                    peer, _ = rude.accept()
                except OSError:
                    return
                connections.append(peer)
                peer.close()

        threading.Thread(target=hang_up, daemon=True).start()
        backend = dataclasses.replace(
            backend_at(f"http://127.0.0.1:{rude.getsockname()[1]}"), timeout=SHORT_TIMEOUT
        )

        with pytest.raises(BackendError, match="did not answer"):
            backend.read()
    assert len(connections) == 1
