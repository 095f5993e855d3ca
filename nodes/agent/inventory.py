"""What this machine has: cards, driver, container runtime, storage root, budgets (J4)."""

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .member import containers

PROBE_TIMEOUT = 10


def probe_output(*command: str) -> str | None:
    """What a probe command prints, or None if it is missing, fails or hangs."""
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


@dataclass
class Gpus:
    cards: list[dict] = field(default_factory=list)
    driver: str | None = None
    uuids: list[str] = field(default_factory=list)
    # Each card by its index (PCI bus order, as CUDA_DEVICE_ORDER=PCI_BUS_ID counts) and UUID.
    devices: list[dict] = field(default_factory=list)


def cards_of(devices: list[dict]) -> list[dict]:
    counts: dict[str, int] = {}
    for device in devices:
        counts[device["name"]] = counts.get(device["name"], 0) + 1
    return [{"name": name, "count": count} for name, count in sorted(counts.items())]


def probe_gpus() -> Gpus:
    out = probe_output(
        "nvidia-smi",
        "--query-gpu=index,name,driver_version,uuid,pci.bus_id",
        "--format=csv,noheader",
    )
    gpus = Gpus()
    if not out:
        return gpus
    found = []
    for line in out.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) < 4 or not parts[1] or not parts[0].isdigit():
            continue
        gpus.driver = gpus.driver or parts[2]
        gpus.uuids.append(parts[3])
        found.append((parts[4] if len(parts) > 4 else "", int(parts[0]), parts[1], parts[3]))
    # nvidia-smi's own index may follow a different order; CUDA's PCI_BUS_ID order is the
    # bus id's, and that is the index a member's CUDA_VISIBLE_DEVICES names.
    found.sort(key=lambda item: (item[0], item[1]))
    gpus.devices = [
        {"index": index, "uuid": uuid, "name": name}
        for index, (_bus, _smi, name, uuid) in enumerate(found)
    ]
    gpus.cards = cards_of(gpus.devices)
    return gpus


def memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def storage_root_visible(root: str | None) -> bool:
    return bool(root) and os.path.isdir(root) and os.access(root, os.R_OK | os.X_OK)


def probe(
    *,
    storage_root: str | None,
    cpu_budget: int | None,
    memory_budget_bytes: int | None,
    runtime=containers.probe,
) -> tuple[dict, list[str]]:
    """The inventory, and the GPU UUIDs (which go only into the fingerprint). ``runtime``
    probes the container runtime (the agent's caches it between beats)."""
    gpus = probe_gpus()
    return {
        "cards": gpus.cards,
        "devices": gpus.devices,
        "driver": gpus.driver,
        "container_runtime": runtime(),
        "storage_root_visible": storage_root_visible(storage_root),
        "cpu_budget": cpu_budget or os.cpu_count(),
        "memory_budget_bytes": memory_budget_bytes or memory_bytes(),
    }, gpus.uuids


def from_file(path: str) -> dict:
    """``--inventory-file``: the console's inventory format, in place of probing."""
    with open(path) as handle:
        data = json.load(handle)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: an inventory file holds one JSON object")
    if data.get("devices") and "cards" not in data:
        data["cards"] = cards_of(data["devices"])
    return data


def fingerprint(gpu_uuids: list[str], machine_id_path: str = "/etc/machine-id") -> str:
    """A hash of machine-id and GPU UUIDs: says "same machine", never used as identity."""
    try:
        machine_id = Path(machine_id_path).read_text().strip()
    except OSError:
        machine_id = ""
    if not machine_id and not gpu_uuids:
        return ""
    material = "\n".join([machine_id, *sorted(gpu_uuids)])
    return hashlib.sha256(material.encode()).hexdigest()
