"""A real gateway and real agents as subprocesses, and hand-built gRPC clients."""

import datetime as dt
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import grpc

from nodes.agent.proto import control_pb2 as pb
from nodes.agent.proto import control_pb2_grpc
from nodes.services.join import node_join
from tests.conftest import H100_INVENTORY, make_csr
from tests.nodes.agent_process import inventory_file, machine

from .console import ROOT, console_env, free_port


def wait_until(check, timeout=20.0, what="condition", interval=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def start_gateway(tmp_path, console_pki, port: int, **settings):
    """``manage.py grpcserve`` on ``port``, serving once this returns; its output is read on
    while it serves (a pipe nobody reads fills up, and the gateway then blocks on its next
    log line). Returns the process and the list its lines go to."""
    env = console_env(
        tmp_path,
        **{
            "TUNEPLANE_PKI_DIR": str(console_pki),
            "TUNEPLANE_HEARTBEAT_INTERVAL": "1",
            "TUNEPLANE_LEASE_TTL": "3",
            **settings,
        },
    )
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "grpcserve", "--bind", f"127.0.0.1:{port}"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    line = process.stdout.readline()
    assert "gateway serving" in line, line + process.stdout.read()
    lines: list[str] = []
    process.reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
    process.reader.start()
    return process, lines


@contextmanager
def running_gateway(tmp_path, console_pki, **settings):
    """``manage.py grpcserve`` on a free port; stopped with SIGTERM, which must exit 0."""
    port = free_port()
    process, lines = start_gateway(tmp_path, console_pki, port, **settings)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)
        process.reader.join(timeout=5)
    assert process.returncode == 0, "".join(lines)


def lay_out_a_joined_node(node_fleet, mint, tmp_path, name="gpu-01"):
    """A node that joined through the real service, with its state dir laid out as join does."""
    from nodes.agent import state

    key_pem, csr = make_csr()
    result = node_join(
        token=mint(node_fleet)[1], fleet_id=node_fleet.id, csr=csr, inventory=H100_INVENTORY
    )
    env = machine(tmp_path, name)
    directory = Path(env["TUNEPLANE_NODE_STATE_DIR"])
    state.save_credential(
        directory,
        identity={
            "node_id": result.node.id,
            "fleet": node_fleet.id,
            "server": "http://127.0.0.1",
            "gateway_target": "unused",
            "credential_expires_at": "",
            "credential_issued_at": dt.datetime.now(dt.UTC).isoformat(),
        },
        key_pem=key_pem,
        certificate_pem=result.certificate.pem,
        ca_bundle=result.ca_bundle,
    )
    return result.node, env, directory


def credentials(directory: Path, *, key=None, cert=None, with_client=True):
    root = (directory / "ca.pem").read_bytes()
    if not with_client:
        return grpc.ssl_channel_credentials(root_certificates=root)
    return grpc.ssl_channel_credentials(
        root_certificates=root,
        private_key=key or (directory / "node.key").read_bytes(),
        certificate_chain=cert or (directory / "node.crt").read_bytes(),
    )


def connect(target, creds, node_id, timeout=5):
    """A hand-built client: Hello, then the first answer (or the RPC error)."""
    with grpc.secure_channel(target, creds) as channel:
        call = control_pb2_grpc.NodeControlStub(channel).Connect(
            iter([pb.NodeMessage(hello=pb.Hello(node_id=node_id))]), timeout=timeout
        )
        try:
            return next(call)
        except grpc.RpcError as error:
            return error


class AgentProcess:
    """A running agent whose output is read as it comes, so a test can wait for a line."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    @property
    def returncode(self):
        return self.process.returncode

    def wait_for(self, text: str, timeout: float = 20) -> None:
        wait_until(lambda: text in self.output, timeout, what=f"the agent to print {text!r}")

    def send_signal(self, signum) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout=None) -> int:
        return self.process.wait(timeout)

    def communicate(self, timeout=None) -> tuple[str, None]:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:  # what it printed says where it stopped
            raise AssertionError(f"the agent ran on past {timeout} s:\n{self.output}") from None
        self._reader.join(5)
        return self.output, None


def member_uids_of_its_own() -> str:
    """A uid range no other agent of this test run uses: agents started side by side (one
    pytest-xdist worker each, several per test) never hand out the same uid, as two agents
    of one machine sharing a range could."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    first = 62000 + worker * UIDS_PER_WORKER + next(_agents) % AGENTS_PER_WORKER * UIDS_PER_AGENT
    return f"{first}-{first + UIDS_PER_AGENT - 1}"


UIDS_PER_AGENT, AGENTS_PER_WORKER = 20, 25
UIDS_PER_WORKER = UIDS_PER_AGENT * AGENTS_PER_WORKER
_agents = itertools.count()


def serve(
    env, target, tmp_path, *options, inventory=H100_INVENTORY, member_uids=None
) -> AgentProcess:
    """``tuneplane-node serve`` as a machine runs it: as root, each member confined to a
    uid of its own (R11), from a range no other agent of the run uses unless
    ``member_uids`` names one ("none": members run as the agent's user). A confined member
    sees nothing of the node but its scratch dir (running.release hands it a file there)."""
    member_uids = member_uids or member_uids_of_its_own()
    return AgentProcess(
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nodes.agent",
                "serve",
                "--target",
                target,
                "--inventory-file",
                inventory_file(tmp_path, inventory),
                "--member-uids",
                member_uids,
                *options,
            ],
            cwd=ROOT,
            text=True,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("TUNEPLANE")}, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
    )
