"""What this machine's cards and host are doing now: the samples the agent sends as Telemetry.

Cards are read through NVML (nvidia-ml-py) where the driver's library loads, through
``nvidia-smi --query-gpu`` otherwise, or from a JSON file (``--telemetry-file``: machines
without GPUs, and tests), re-read at every sample. A source that cannot answer this time
says so (``source`` empty) rather than report no cards: a card missing from a sample that
had it is a fault the console acts on, a failed probe is not.

A sample is taken every interval but sent only when it says something new (Reporter): the
first of a stream, a change to the cards' health at once, a figure beyond its deadband, and
otherwise every wire.TELEMETRY_REFRESH_INTERVALS. Receiving a sample costs a gateway about
what a heartbeat does (make bench), so a steady node's samples are mostly kept home.
"""

import json
import logging
import os
import threading
from pathlib import Path

from . import wire
from .inventory import probe_output

logger = logging.getLogger("tuneplane-node")

NVML, NVIDIA_SMI, FILE = "nvml", "nvidia-smi", "file"
SMI_FIELDS = (
    "uuid,name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw,"
    "ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total"
)
MIB = 2**20
# How long the NVML event thread waits for an XID before looking at the stop flag again.
XID_WAIT_MS = 1000


def _number(text: str, cast=float):
    """nvidia-smi's value, or 0 for "[N/A]", "[Not Supported]" and the like."""
    try:
        return cast(float(text))
    except ValueError:
        return 0


def parse_smi(out: str, devices: list[dict]) -> list[dict]:
    """``nvidia-smi --query-gpu=SMI_FIELDS --format=csv,noheader,nounits`` as card samples,
    indexed as the inventory's devices are (PCI bus order), by UUID."""
    index_of = {device["uuid"]: device["index"] for device in devices}
    cards = []
    for position, line in enumerate(out.splitlines()):
        parts = [part.strip() for part in line.split(",")]
        if len(parts) < 9 or not parts[0]:
            continue
        cards.append(
            {
                "index": index_of.get(parts[0], position),
                "uuid": parts[0],
                "name": parts[1],
                "utilization_percent": _number(parts[2]),
                "memory_used_bytes": _number(parts[3], int) * MIB,
                "memory_total_bytes": _number(parts[4], int) * MIB,
                "temperature_celsius": _number(parts[5]),
                "power_watts": _number(parts[6]),
                "ecc_corrected": _number(parts[7], int),
                "ecc_uncorrected": _number(parts[8], int),
                "xid_counts": {},
            }
        )
    return cards


class SmiSource:
    name = NVIDIA_SMI

    def cards(self, devices: list[dict]) -> list[dict] | None:
        out = probe_output(
            "nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"
        )
        return None if out is None else parse_smi(out, devices)


class FileSource:
    """``{"cards": [{"index", "uuid", "name", "utilization_percent", ..., "xid_counts":
    {"79": 1}}]}``, the fields of a CardSample, read afresh each time; with ``"host":
    {"cpu_percent", "memory_used_bytes", "memory_total_bytes"}`` too, the host's figures
    are the file's, not the machine's (a test that needs them steady)."""

    name = FILE

    def __init__(self, path: str):
        self.path = path
        self.host: dict | None = None

    def cards(self, devices: list[dict]) -> list[dict] | None:
        try:
            data = json.loads(Path(self.path).read_text())
            self.host = data.get("host")
            return [
                {**card, "xid_counts": {int(k): v for k, v in card.get("xid_counts", {}).items()}}
                for card in data["cards"]
            ]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            logger.warning("telemetry file %s unreadable: %s", self.path, error)
            return None


class NvmlSource:
    """NVML, with a thread counting each card's XID events as the driver posts them."""

    name = NVML

    def __init__(self, nvml):
        self.nvml = nvml
        nvml.nvmlInit()
        self.xids: dict[str, dict[int, int]] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        threading.Thread(target=self._count_xids, daemon=True).start()

    def _handles(self):
        nvml = self.nvml
        for position in range(nvml.nvmlDeviceGetCount()):
            try:
                yield nvml.nvmlDeviceGetHandleByIndex(position)
            except nvml.NVMLError as error:  # fallen off the bus: missing from the sample
                logger.warning("NVML: card %d unreadable: %s", position, error)

    def _count_xids(self) -> None:
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
            for handle in self._handles():
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
        except nvml.NVMLError as error:
            logger.warning("NVML: XID events unavailable: %s", error)
            return
        while not self.stopping.is_set():
            try:
                event = nvml.nvmlEventSetWait_v2(events, XID_WAIT_MS)
            except nvml.NVMLError:  # a timeout, most often
                continue
            uuid = _text(nvml.nvmlDeviceGetUUID(event.device))
            with self.lock:
                counts = self.xids.setdefault(uuid, {})
                counts[int(event.eventData)] = counts.get(int(event.eventData), 0) + 1

    def _optional(self, read, *args, default=0):
        try:
            return read(*args)
        except self.nvml.NVMLError:  # not supported by this card (ECC on consumer parts)
            return default

    def _card(self, handle, position: int, index_of: dict) -> dict:
        nvml = self.nvml
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        utilization = self._optional(nvml.nvmlDeviceGetUtilizationRates, handle, default=None)
        errors = nvml.nvmlDeviceGetTotalEccErrors
        with self.lock:
            xids = dict(self.xids.get(uuid, {}))
        return {
            "index": index_of.get(uuid, position),
            "uuid": uuid,
            "name": _text(nvml.nvmlDeviceGetName(handle)),
            "utilization_percent": utilization.gpu if utilization is not None else 0,
            "memory_used_bytes": memory.used,
            "memory_total_bytes": memory.total,
            "temperature_celsius": self._optional(
                nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
            ),
            "power_watts": self._optional(nvml.nvmlDeviceGetPowerUsage, handle) / 1000,
            "ecc_corrected": self._optional(
                errors, handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC
            ),
            "ecc_uncorrected": self._optional(
                errors, handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            ),
            "xid_counts": xids,
        }

    def cards(self, devices: list[dict]) -> list[dict] | None:
        index_of = {device["uuid"]: device["index"] for device in devices}
        try:
            return [
                self._card(handle, position, index_of)
                for position, handle in enumerate(self._handles())
            ]
        except self.nvml.NVMLError as error:
            logger.warning("NVML: sample failed: %s", error)
            return None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def source(telemetry_file: str | None):
    """The file when given; else NVML where its library loads; else nvidia-smi."""
    if telemetry_file:
        return FileSource(telemetry_file)
    try:
        import pynvml

        return NvmlSource(pynvml)
    except Exception as error:  # no nvidia-ml-py, or no driver library: NVMLError_LibraryNotFound
        logger.info("NVML unavailable (%s); reading cards with nvidia-smi", error)
        return SmiSource()


class Host:
    """The host's CPU use between two samples (/proc/stat) and its memory (/proc/meminfo)."""

    def __init__(self, proc: str = "/proc"):
        self.proc = Path(proc)
        self.last: tuple[int, int] | None = None

    def cpu_percent(self) -> float:
        try:
            fields = [int(v) for v in (self.proc / "stat").read_text().split("\n")[0].split()[1:]]
        except (OSError, ValueError):
            return 0.0
        idle, total = fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields)
        last, self.last = self.last, (idle, total)
        if last is None or total <= last[1]:
            return 0.0
        return round(100.0 * (1 - (idle - last[0]) / (total - last[1])), 1)

    def memory(self) -> tuple[int, int]:
        values = {}
        try:
            for line in (self.proc / "meminfo").read_text().splitlines():
                key, _, rest = line.partition(":")
                values[key] = int(rest.split()[0]) * 1024
        except (OSError, ValueError, IndexError):
            return 0, 0
        total = values.get("MemTotal", 0)
        return max(total - values.get("MemAvailable", total), 0), total


def unopened(devices: list[dict], dev: str = "/dev") -> dict[str, str]:
    """H5's built-in check, each sample: the inventory's cards whose device node the driver
    cannot open (``/dev/nvidiaN``, N the card's index as the members' bundles bind it), by
    UUID, with why. Opened read-only and closed at once: no member loses its card for it."""
    faults = {}
    for device in devices:
        path = f"{dev}/nvidia{device['index']}"
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
        except OSError as error:
            faults[device["uuid"]] = f"cannot open {path}: {error.strerror}"
    return faults


def sample(cards_source, host: Host, devices: list[dict], dev: str = "/dev") -> dict:
    """One sample: the cards (None when the source could not answer) and the host. A card of
    a real driver's (NVML, nvidia-smi) whose device node cannot be opened carries that fault;
    a file source says its cards' faults itself."""
    cards = cards_source.cards(devices) if cards_source is not None else None
    if cards and getattr(cards_source, "name", FILE) != FILE:
        faults = unopened(devices, dev)
        cards = [{**card, "fault": faults.get(card["uuid"], "")} for card in cards]
    used, total = host.memory()
    figures = {
        "cpu_percent": host.cpu_percent(),
        "memory_used_bytes": used,
        "memory_total_bytes": total,
    }
    given = getattr(cards_source, "host", None) or {}
    return {
        "source": cards_source.name if cards is not None else "",
        "cards": cards or [],
        **{key: given.get(key, value) for key, value in figures.items()},
    }


# How far a figure may move from the last sent sample before the move is news. Sized to what
# an operator reads off the Fleet page's bars or a 15 s graph: smaller moves are a steady
# job's jitter (utilisation flickering a few points, temperature a degree or two, power tens
# of watts), and would make nearly every sample news. Health is never deadbanded: a card
# gained or lost, its XID or uncorrectable ECC counts, or the probe failing or recovering
# (``source``) are sent at once, as the console judges health from them; corrected ECC
# counts too (a card starting to fail), and a total changing (another card, more memory).
UTILIZATION_POINTS = 10.0  # a card's utilisation and the host's CPU, percentage points
MEMORY_SHARE = 0.05  # memory used, a card's or the host's, as a share of its total
TEMPERATURE_CELSIUS = 5.0
# Power, as a share of the last sent draw, at least the floor: an idle card's 60 W wanders.
POWER_SHARE, POWER_FLOOR_WATTS = 0.10, 10.0
EXACT_CARD_FIELDS = (
    "index",
    "name",
    "memory_total_bytes",
    "ecc_corrected",
    "ecc_uncorrected",
    "fault",
)


def _beyond(sent: float, now: float, band: float) -> bool:
    """Moved by the band or more (any move, where the band is 0: a total not reported)."""
    return now != sent and abs(now - sent) >= band


def _card_moved(sent: dict, card: dict) -> bool:
    if any(sent.get(key) != card.get(key) for key in EXACT_CARD_FIELDS):
        return True
    if (sent.get("xid_counts") or {}) != (card.get("xid_counts") or {}):
        return True
    bands = {
        "utilization_percent": UTILIZATION_POINTS,
        "memory_used_bytes": MEMORY_SHARE * card["memory_total_bytes"],
        "temperature_celsius": TEMPERATURE_CELSIUS,
        "power_watts": max(POWER_SHARE * sent["power_watts"], POWER_FLOOR_WATTS),
    }
    return any(_beyond(sent[key], card[key], band) for key, band in bands.items())


def news(sent: dict, sample: dict) -> bool:
    """Whether a sample says something the last sent one did not (the deadbands above)."""
    if sample["source"] != sent["source"]:
        return True
    before = {card["uuid"]: card for card in sent["cards"]}
    cards = {card["uuid"]: card for card in sample["cards"]}
    if before.keys() != cards.keys():
        return True
    if any(_card_moved(before[uuid], card) for uuid, card in cards.items()):
        return True
    total = sample["memory_total_bytes"]
    return (
        total != sent["memory_total_bytes"]
        or _beyond(sent["cpu_percent"], sample["cpu_percent"], UTILIZATION_POINTS)
        or _beyond(sent["memory_used_bytes"], sample["memory_used_bytes"], MEMORY_SHARE * total)
    )


class Reporter:
    """Which of one stream's samples are sent: the first; any with news (above); and, when
    nothing was sent for wire.TELEMETRY_REFRESH_INTERVALS, the next one, so the console's
    figures are confirmed at least that often. A pure decision: time is given (monotonic
    seconds). A new stream gets a new Reporter, so its console is told at once."""

    def __init__(self, interval: float):
        # Half an interval early rather than one late: samples are taken on a clock, and a
        # probe a little faster than the one before must not put the refresh off by one.
        self.refresh = (wire.TELEMETRY_REFRESH_INTERVALS - 0.5) * interval
        self.sent: dict | None = None
        self.sent_at = 0.0

    def due(self, sample: dict, now: float) -> bool:
        """Whether to send this sample; when it is, it becomes the last sent."""
        fresh = self.sent is not None and now - self.sent_at < self.refresh
        if fresh and not news(self.sent, sample):
            return False
        self.sent, self.sent_at = sample, now
        return True
