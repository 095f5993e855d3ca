"""``tuneplane-node join``, ``serve`` and ``status``."""

import argparse
import logging
import os
import signal
import socket
import sys
from datetime import UTC, datetime

from cryptography import x509

from . import __version__, enroll, inventory, state
from .member import isolation, network


def _join(args) -> int:
    directory = state.state_dir(args.state_dir)
    existing = state.read_identity(directory)
    if existing:
        raise enroll.JoinFailed(
            f"{directory} already holds node {existing['node_id']} of fleet {existing['fleet']}; "
            "a machine that joins again is a new node: move that directory away first"
        )
    token = args.token or os.environ.get("TUNEPLANE_JOIN_TOKEN", "")
    if not token:
        raise enroll.JoinFailed("no join token: pass --token or set TUNEPLANE_JOIN_TOKEN")
    server = enroll.check_server(args.server)
    hostname = socket.gethostname()
    if args.inventory_file:
        try:
            report, gpu_uuids = inventory.from_file(args.inventory_file), []
        except (OSError, ValueError) as error:
            raise enroll.JoinFailed(f"cannot read --inventory-file: {error}") from None
    else:
        report, gpu_uuids = inventory.probe(
            storage_root=args.storage_root,
            cpu_budget=args.cpu_budget,
            memory_budget_bytes=args.memory_budget_bytes,
        )
    key_pem, csr = enroll.new_key_and_csr(hostname)
    answer = enroll.join(
        server=server,
        fleet=args.fleet,
        token=token,
        csr=csr,
        inventory=report,
        address=args.address or enroll.local_address(server),
        hostname=hostname,
        fingerprint=inventory.fingerprint(
            gpu_uuids, os.environ.get("TUNEPLANE_MACHINE_ID_FILE", "/etc/machine-id")
        ),
        ca_file=args.ca_file,
    )
    state.save_credential(
        directory,
        identity={
            "node_id": answer["node_id"],
            "fleet": answer["fleet"],
            "server": server,
            "gateway_target": answer["gateway_target"],
            "credential_expires_at": answer["credential_expires_at"],
            "credential_issued_at": datetime.now(UTC).isoformat(),
        },
        key_pem=key_pem,
        certificate_pem=answer["certificate"],
        ca_bundle=answer["ca_bundle"],
    )
    print(f"Joined fleet {answer['fleet']} as node {answer['node_id']}.")
    for warning in answer.get("warnings", []):
        print(f"warning: {warning['code']}: {warning['message']}")
    print(
        f"Credential in {directory} (expires {answer['credential_expires_at']}); "
        "it is not shown again."
    )
    print(f"Next: tuneplane-node serve --target {answer['gateway_target']}")
    return 0


def _serve(args) -> int:
    from .serve import Agent  # grpc is needed only here

    directory = state.state_dir(args.state_dir)
    identity = state.read_identity(directory)
    if identity is None:
        raise enroll.JoinFailed(f"not joined: no identity in {directory}; run join first")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s tuneplane-node %(message)s")
    agent = Agent(
        directory=directory,
        target=args.target
        or os.environ.get("TUNEPLANE_GATEWAY_TARGET")
        or identity["gateway_target"],
        inventory_file=args.inventory_file,
        storage_root=args.storage_root,
        cpu_budget=args.cpu_budget,
        memory_budget_bytes=args.memory_budget_bytes,
        telemetry_file=args.telemetry_file,
        member_uids=isolation.uid_range(args.member_uids),
        member_deny_cidrs=_deny_cidrs(args.member_deny_cidrs),
    )
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: agent.stop())
    return agent.run()


def _deny_cidrs(text: str | None) -> list[str]:
    """R19: the networks no member reaches, checked at start (a malformed one stops it)."""
    cidrs = [part.strip() for part in (text or "").split(",") if part.strip()]
    try:
        network.deny_networks(cidrs)
    except ValueError as error:
        raise SystemExit(f"--member-deny-cidrs: {error}") from None
    return cidrs


def _status(args) -> int:
    directory = state.state_dir(args.state_dir)
    identity = state.read_identity(directory)
    if identity is None:
        print(f"not joined: no identity in {directory}")
        return 1
    cert = x509.load_pem_x509_certificate((directory / state.CERTIFICATE).read_bytes())
    expires = cert.not_valid_after_utc
    left = expires - datetime.now(UTC)
    print(f"node        {identity['node_id']}")
    print(f"fleet       {identity['fleet']}")
    print(f"console     {identity['server']}")
    print(f"gateway     {identity['gateway_target']}")
    print(
        f"credential  expires {expires.isoformat()}"
        f" ({'expired' if left.total_seconds() <= 0 else f'in {left}'.split('.')[0]})"
    )
    return 0


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="tuneplane-node", description="The Tuneplane node agent.")
    root.add_argument("--version", action="version", version=f"tuneplane-node {__version__}")
    root.add_argument(
        "--state-dir",
        help="Private state directory "
        f"(TUNEPLANE_NODE_STATE_DIR, default {state.DEFAULT_STATE_DIR}).",
    )
    commands = root.add_subparsers(dest="command", required=True)

    join = commands.add_parser("join", help="Join a node Fleet with a single-use join token.")
    join.add_argument("--server", required=True, help="The console's URL.")
    join.add_argument("--fleet", required=True, help="The Fleet's id.")
    join.add_argument("--token", help="The join token (or TUNEPLANE_JOIN_TOKEN).")
    join.add_argument("--inventory-file", help="Report this inventory instead of probing.")
    _budget_options(join)
    join.add_argument("--address", help="Address to report (default: the one facing the console).")
    join.add_argument("--ca-file", help="CA bundle to trust for the console's HTTPS.")
    join.set_defaults(run=_join)

    serve = commands.add_parser("serve", help="Hold the control stream to the gateway.")
    serve.add_argument("--target", help="Gateway HOST:PORT (default: what join was told).")
    serve.add_argument("--inventory-file", help="Report this inventory instead of probing.")
    serve.add_argument(
        "--telemetry-file",
        default=os.environ.get("TUNEPLANE_TELEMETRY_FILE"),
        help="Read card telemetry from this JSON file instead of NVML or nvidia-smi "
        "(TUNEPLANE_TELEMETRY_FILE).",
    )
    serve.add_argument(
        "--member-uids",
        default=os.environ.get("TUNEPLANE_NODE_MEMBER_UIDS", isolation.DEFAULT_UIDS),
        help="Each member runs as a uid of its own from FIRST-LAST, in namespaces of its own "
        f"(R11; default {isolation.DEFAULT_UIDS}, TUNEPLANE_NODE_MEMBER_UIDS); 'none' runs "
        "members as the agent's own user.",
    )
    serve.add_argument(
        "--member-deny-cidrs",
        default=os.environ.get("TUNEPLANE_MEMBER_DENY_CIDRS", ""),
        help="Networks no member may reach, comma-separated CIDRs (R19; "
        "TUNEPLANE_MEMBER_DENY_CIDRS): the console's PostgreSQL and Redis networks, say. "
        "Members never reach this node's own addresses or link-local ones in any case.",
    )
    _budget_options(serve)
    serve.set_defaults(run=_serve)

    status = commands.add_parser("status", help="Identity, Fleet and credential expiry.")
    status.set_defaults(run=_status)
    return root


def _budget_options(command) -> None:
    command.add_argument(
        "--storage-root",
        default=os.environ.get("TUNEPLANE_STORAGE_ROOT"),
        help="Shared storage root to check (TUNEPLANE_STORAGE_ROOT).",
    )
    command.add_argument(
        "--cpu-budget",
        type=int,
        default=_env_int("TUNEPLANE_CPU_BUDGET"),
        help="CPUs work may use (TUNEPLANE_CPU_BUDGET; default all).",
    )
    command.add_argument(
        "--memory-budget-bytes",
        type=int,
        default=_env_int("TUNEPLANE_MEMORY_BUDGET_BYTES"),
        help="Memory work may use (TUNEPLANE_MEMORY_BUDGET_BYTES; default all).",
    )


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value and value.isdigit() else None


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except enroll.JoinFailed as failure:
        print(f"tuneplane-node: {failure}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
