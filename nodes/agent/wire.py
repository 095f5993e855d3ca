"""What the agent and the gateway say to each other, built and read in one place: the
gateway imports this module, never the other way round (it imports no Django)."""

import hashlib
import json
from dataclasses import dataclass, field

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
    checkpoint_at: float | None = None,
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
        checkpoint_at=checkpoint_at or 0.0,
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


# The most of a member's output one log answer carries (R15): half gRPC's 1 MiB message
# limit, so the largest answer and its envelope never end the node's control stream. The
# console asks no more; the agent answers no more, whatever it is asked.
LOG_TAIL_MAX = 512 * 1024


def log_request(
    request_id: str, member_id: str, tail_bytes: int, offset: int | None = None
) -> pb.ControlMessage:
    """The last ``tail_bytes`` of a member's output, or as many from ``offset`` on."""
    request = pb.LogRequest(request_id=request_id, member_id=member_id, tail_bytes=tail_bytes)
    if offset is not None:
        request.offset = offset
    return pb.ControlMessage(log_request=request)


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
            fault=str(c.get("fault") or "")[:200],
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
                "fault": c.fault,
            }
            for c in message.cards
        ],
        "cpu_percent": message.cpu_percent,
        "memory_used_bytes": message.memory_used_bytes,
        "memory_total_bytes": message.memory_total_bytes,
    }


# A member's start, as the agent reads it ----------------------------------------------------


class Refused(ValueError):
    """A start the agent will not run; the text says why (reported as the member's detail)."""


@dataclass(frozen=True)
class Card:
    index: int
    uuid: str


@dataclass(frozen=True)
class Serve:
    """A replica's port (given to it as PORT) and the path its readiness probe GETs (S1)."""

    port: int
    readiness_path: str = "/"


DEFAULT_GRACE = 30.0


@dataclass(frozen=True)
class MemberSpec:
    """What a ``start`` command's payload asks this node to run (R4), checked once, here.

    Exactly one of ``argv`` and ``script`` says what runs, or neither when ``image`` has its
    own entrypoint. ``serve`` makes it a replica; a ``serve`` that names no usable port is a
    job's member (the console never sends one)."""

    cards: tuple[Card, ...] = ()
    argv: tuple[str, ...] = ()
    script: str = ""
    image: str = ""
    env: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)
    delivery_mode: str = ""
    delivery_env: dict = field(default_factory=dict)
    rendezvous: dict = field(default_factory=dict)
    serve: Serve | None = None
    cpus: float | None = None
    memory_bytes: int | None = None
    grace: float = DEFAULT_GRACE
    pids: int | None = None  # the most processes it may have at once (R12)
    log_bytes: int | None = None  # its log is cut to its newest part past this size (R16)
    scratch_bytes: int | None = None  # past this size its scratch dir stops it (R16)
    # "always": its image is pulled at every start, never run from the node's cache without
    # the registry's say (R14; its Fleet's config ``image_pull``); "": the runtime's default.
    pull: str = ""
    # H5: a Fleet's health check, not a member: its output's tail is reported at its end.
    health_check: bool = False

    @classmethod
    def parse(cls, payload) -> "MemberSpec":
        """The spec a payload gives, or Refused saying which part is unusable."""
        if not isinstance(payload, dict):
            raise Refused("refused: the start's payload is not an object")
        argv, script, image = payload.get("argv"), payload.get("script"), payload.get("image")
        if image is not None and not (isinstance(image, str) and image and image[0] != "-"):
            raise Refused("refused: image must be an image reference")
        argv_ok = isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)
        if not argv_ok and not (isinstance(script, str) and script) and not image:
            raise Refused("refused: neither argv nor script nor image")
        cards = payload.get("cards")
        if not isinstance(cards, list) or not all(
            isinstance(card, dict) and isinstance(card.get("index"), int) for card in cards
        ):
            raise Refused("refused: cards must be a list of {index, uuid}")
        delivery = payload.get("delivery") if isinstance(payload.get("delivery"), dict) else {}
        grace = payload.get("grace_seconds")
        return cls(
            cards=tuple(Card(card["index"], str(card.get("uuid") or "")) for card in cards),
            argv=tuple(argv) if argv_ok else (),
            script=script if isinstance(script, str) else "",
            image=image or "",
            env=_strings(payload.get("env")),
            labels=_strings(payload.get("labels")),
            delivery_mode=str(delivery.get("mode") or ""),
            delivery_env=_strings(delivery.get("env")),
            rendezvous=_strings(payload.get("rendezvous")),
            serve=_serve(payload.get("serve")),
            cpus=_positive(payload.get("cpus"), float),
            memory_bytes=_positive(payload.get("memory_bytes"), int),
            grace=float(grace) if _number(grace) and grace >= 0 else DEFAULT_GRACE,
            pids=_positive(payload.get("pids"), int),
            log_bytes=_positive(payload.get("log_bytes"), int),
            pull="always" if payload.get("pull") == "always" else "",
            scratch_bytes=_positive(payload.get("scratch_bytes"), int),
            health_check=payload.get("health_check") is True,
        )

    @property
    def card_indices(self) -> set[int]:
        return {card.index for card in self.cards}

    def payload(self) -> dict:
        """The ``start`` command's payload as the console writes it: ``parse`` reads it back
        to an equal spec."""
        payload = {
            "cards": [{"index": card.index, "uuid": card.uuid} for card in self.cards],
            "env": dict(self.env),
            "labels": dict(self.labels),
            "delivery": {"mode": self.delivery_mode, "env": dict(self.delivery_env)},
            "rendezvous": dict(self.rendezvous),
            "cpus": self.cpus,
            "memory_bytes": self.memory_bytes,
            "grace_seconds": self.grace,
            "pids": self.pids,
            "log_bytes": self.log_bytes,
            "scratch_bytes": self.scratch_bytes,
        }
        if self.pull:
            payload["pull"] = self.pull
        if self.health_check:
            payload["health_check"] = True
        if self.argv:
            payload["argv"] = list(self.argv)
        if self.script:
            payload["script"] = self.script
        if self.image:
            payload["image"] = self.image
        if self.serve is not None:
            serve = self.serve
            payload["serve"] = {"port": serve.port, "readiness_path": serve.readiness_path}
        return payload


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive(value, kind):
    return kind(value) if _number(value) and value > 0 else None


def _strings(value) -> dict:
    """A mapping of names to values as written (a label's or a rank's number stays a number;
    launch.own_env makes each a string)."""
    if not isinstance(value, dict):
        return {}
    return {
        str(key): item if isinstance(item, (str, int, float)) else str(item)
        for key, item in value.items()
    }


def _serve(value) -> Serve | None:
    if not isinstance(value, dict):
        return None
    port, path = value.get("port"), value.get("readiness_path") or "/"
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        return None
    if not isinstance(path, str) or not path.startswith("/") or any(c <= " " for c in path):
        path = "/"
    return Serve(port, path)
