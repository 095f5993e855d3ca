"""What the agent and the gateway say to each other, built and read in one place: the
gateway imports this module, never the other way round (it imports no Django)."""

import hashlib
import json

from google.protobuf.json_format import MessageToDict

from .proto import control_pb2 as pb


def inventory_message(report: dict) -> pb.InventoryReport:
    """An inventory report (the ``--inventory-file`` format) as sent on the stream."""
    return pb.InventoryReport(
        cards=[pb.Card(name=c["name"], count=c["count"]) for c in report.get("cards", [])],
        driver=report.get("driver") or "",
        container_runtime=report.get("container_runtime") or "",
        storage_root_visible=bool(report.get("storage_root_visible")),
        cpu_budget=report.get("cpu_budget") or 0,
        memory_budget_bytes=report.get("memory_budget_bytes") or 0,
        devices=[
            pb.Device(index=d["index"], uuid=d["uuid"], name=d["name"])
            for d in sorted(report.get("devices") or [], key=lambda device: device["index"])
        ],
    )


def inventory_report(message: pb.InventoryReport) -> dict:
    """The report a node sent, back in the ``--inventory-file`` format."""
    data = MessageToDict(message, preserving_proto_field_name=True)
    data["cards"] = [{"name": c.name, "count": c.count} for c in message.cards]
    data["storage_root_visible"] = message.storage_root_visible
    data.pop("devices", None)
    if message.devices:
        data["devices"] = [
            {"index": d.index, "uuid": d.uuid, "name": d.name} for d in message.devices
        ]
    for key in ("cpu_budget", "memory_budget_bytes"):
        data[key] = int(data[key]) if key in data else None
    return data


def inventory_digest(message: pb.InventoryReport) -> str:
    """What a heartbeat carries for "my inventory is still this"; the gateway computes it of
    the report it stored, and the two must agree byte for byte."""
    return hashlib.sha256(message.SerializeToString(deterministic=True)).hexdigest()


def command_state(
    command_id: str,
    state: str,
    exit_code: int | None,
    *,
    reason: str = "",
    cleaned: bool = False,
    confinement: str = "",
    ready: bool = False,
    restarts: int = 0,
    detail: str = "",
) -> pb.CommandState:
    """A command's durable state as the agent reports it (L5); a member's with why it ended,
    whether it is cleaned up (R7) and how it is confined (R5)."""
    return pb.CommandState(
        command_id=command_id,
        state=state,
        exit_code=exit_code or 0,
        reason=reason or "",
        cleaned=cleaned,
        confinement=confinement or "",
        ready=ready,
        restarts=restarts or 0,
        detail=detail or "",
    )


def command_message(command_id: str, kind: str, payload) -> pb.ControlMessage:
    """A command as the gateway delivers it."""
    return pb.ControlMessage(
        command=pb.Command(command_id=command_id, kind=kind, payload_json=json.dumps(payload))
    )


def command_payload(message: pb.Command):
    """A delivered command's payload; None when it is not JSON (the agent then refuses it)."""
    try:
        return json.loads(message.payload_json or "{}")
    except ValueError:
        return None


def log_request(request_id: str, member_id: str, tail_bytes: int) -> pb.ControlMessage:
    return pb.ControlMessage(
        log_request=pb.LogRequest(request_id=request_id, member_id=member_id, tail_bytes=tail_bytes)
    )


CARD_NUMBERS = (
    "utilization_percent",
    "memory_used_bytes",
    "memory_total_bytes",
    "temperature_celsius",
    "power_watts",
    "ecc_corrected",
    "ecc_uncorrected",
)


# Report by exception (agent/telemetry.py's Reporter): a node whose figures say nothing new
# still sends a sample every this many telemetry intervals (300 s at the console's 15 s), and
# the console counts its figures stale only when not even that came (telemetry_shown.py).
# Counted in the interval the Welcome sends, so one console setting paces both sides.
TELEMETRY_REFRESH_INTERVALS = 20


def telemetry_message(sample: dict) -> pb.NodeMessage:
    """A sample (agent/telemetry.py) as sent on the stream; counts below zero are sent as 0."""

    def card(c: dict) -> pb.CardSample:
        numbers = {key: max(c.get(key) or 0, 0) for key in CARD_NUMBERS}
        for key in ("memory_used_bytes", "memory_total_bytes", "ecc_corrected", "ecc_uncorrected"):
            numbers[key] = int(numbers[key])
        return pb.CardSample(
            index=max(int(c.get("index") or 0), 0),
            uuid=str(c.get("uuid") or ""),
            name=str(c.get("name") or ""),
            xid_counts={int(k): max(int(v), 0) for k, v in (c.get("xid_counts") or {}).items()},
            **numbers,
        )

    return pb.NodeMessage(
        telemetry=pb.Telemetry(
            source=sample.get("source") or "",
            cards=[card(c) for c in sample.get("cards") or []],
            cpu_percent=max(sample.get("cpu_percent") or 0.0, 0.0),
            memory_used_bytes=max(int(sample.get("memory_used_bytes") or 0), 0),
            memory_total_bytes=max(int(sample.get("memory_total_bytes") or 0), 0),
        )
    )


def telemetry_sample(message: pb.Telemetry) -> dict:
    """A node's Telemetry back as a dict, unchecked (the console's telemetry service checks)."""
    return {
        "source": message.source,
        "cards": [
            {
                "index": c.index,
                "uuid": c.uuid,
                "name": c.name,
                **{key: getattr(c, key) for key in CARD_NUMBERS},
                "xid_counts": {str(code): count for code, count in sorted(c.xid_counts.items())},
            }
            for c in message.cards
        ],
        "cpu_percent": message.cpu_percent,
        "memory_used_bytes": message.memory_used_bytes,
        "memory_total_bytes": message.memory_total_bytes,
    }
