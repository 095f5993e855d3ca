"""Telemetry (issue 19) in process: what the agent reads from NVML, nvidia-smi or a file and
how it is put on the wire; what the console keeps (the latest sample per node, nothing
older); bad telemetry refused for its node alone; a gateway's batch, coalescing a flood;
and how the API shows a sample, stale ones as stale."""

import asyncio
import json
import os
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone

from nodes.agent import telemetry as agent_telemetry
from nodes.agent import wire
from nodes.agent.wire import TELEMETRY_REFRESH_INTERVALS
from nodes.gateway.db_threads import DatabaseThreads
from nodes.gateway.streams import Stream, Streams
from nodes.gateway.telemetry import TelemetryBatcher
from nodes.models import NodeTelemetry
from nodes.services.telemetry import MAX_CARDS, telemetry_store
from tests.nodes.gpu_samples import card, sample

DEVICES = [{"index": i, "uuid": f"GPU-{i}", "name": "NVIDIA H100 80GB HBM3"} for i in range(2)]


def test_a_sample_crosses_the_wire_whole():
    sent = {
        "source": "nvml",
        "cards": [card(DEVICES[1], xid_counts={79: 2, 13: 1}, ecc_uncorrected=3)],
        "cpu_percent": 41.5,
        "memory_used_bytes": 2**33,
        "memory_total_bytes": 2**36,
    }
    message = wire.telemetry_message(sent)
    got = wire.telemetry_sample(pb := message.telemetry)
    assert pb.ByteSize() < 200
    assert got["cards"][0]["xid_counts"] == {"13": 1, "79": 2}
    assert got["cards"][0]["uuid"] == "GPU-1" and got["cards"][0]["ecc_uncorrected"] == 3
    assert got["cpu_percent"] == 41.5 and got["memory_total_bytes"] == 2**36


def test_the_agent_parses_nvidia_smi_and_indexes_cards_in_pci_bus_order():
    out = (
        "GPU-1, NVIDIA H100 80GB HBM3, 87, 40960, 81559, 71, 612.40, 0, 0\n"
        "GPU-0, NVIDIA H100 80GB HBM3, [N/A], 0, 81559, 35, [Not Supported], 12, 1\n"
    )
    cards = agent_telemetry.parse_smi(out, DEVICES)
    assert [(c["index"], c["uuid"]) for c in cards] == [(1, "GPU-1"), (0, "GPU-0")]
    assert cards[0]["memory_used_bytes"] == 40960 * 2**20 and cards[0]["power_watts"] == 612.4
    assert cards[1]["utilization_percent"] == 0 and cards[1]["ecc_uncorrected"] == 1


def test_the_agent_runs_nvidia_smi_where_nvml_is_missing(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU-0, NVIDIA H100 80GB HBM3, 5, 1, 2, 30, 70, 0, 0'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    got = agent_telemetry.sample(agent_telemetry.SmiSource(), agent_telemetry.Host(), DEVICES)
    assert got["source"] == "nvidia-smi" and got["cards"][0]["temperature_celsius"] == 30
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # the probe fails: said so
    got = agent_telemetry.sample(agent_telemetry.SmiSource(), agent_telemetry.Host(), DEVICES)
    assert got["source"] == "" and got["cards"] == []


class FakeNvml:
    """The few NVML calls the agent makes, over two cards; card 1 has fallen off the bus."""

    NVMLError = type("NVMLError", (Exception,), {})
    NVML_TEMPERATURE_GPU, NVML_VOLATILE_ECC = 0, 0
    NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    nvmlEventTypeXidCriticalError = 8

    def __init__(self):
        self.events = [SimpleNamespace(device="h0", eventData=79)]

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, position):
        if position == 1:
            raise self.NVMLError("GPU is lost")
        return f"h{position}"

    def nvmlEventSetCreate(self):
        return "events"

    def nvmlDeviceRegisterEvents(self, handle, kinds, events):
        pass

    def nvmlEventSetWait_v2(self, events, timeout_ms):
        if not self.events:
            raise self.NVMLError("timeout")
        return self.events.pop()

    def nvmlDeviceGetUUID(self, handle):
        return b"GPU-0"

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=2**30, total=80 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=93)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 66

    def nvmlDeviceGetPowerUsage(self, handle):
        return 512_000

    def nvmlDeviceGetTotalEccErrors(self, handle, kind, counter):
        raise self.NVMLError("Not Supported")


def test_the_agent_reads_nvml_counts_xids_and_leaves_out_a_lost_card():
    source = agent_telemetry.NvmlSource(FakeNvml())
    try:
        for _ in range(50):
            cards = source.cards(DEVICES)
            if cards[0]["xid_counts"]:
                break
            time.sleep(0.05)
    finally:
        source.stopping.set()
    (only,) = cards
    assert only["uuid"] == "GPU-0" and only["xid_counts"] == {79: 1}
    assert only["utilization_percent"] == 93 and only["power_watts"] == 512
    assert only["ecc_uncorrected"] == 0  # not supported: zero, the sample still sent


def test_the_agent_reads_a_telemetry_file_afresh_each_time(tmp_path):
    path = tmp_path / "telemetry.json"
    source = agent_telemetry.FileSource(str(path))
    assert source.cards(DEVICES) is None  # no file yet: a failed probe, not "no cards"
    path.write_text(json.dumps({"cards": [card(DEVICES[0], xid_counts={"79": 1})]}))
    assert source.cards(DEVICES)[0]["xid_counts"] == {79: 1}


def test_host_cpu_is_the_use_between_two_samples(tmp_path):
    (tmp_path / "stat").write_text("cpu  100 0 100 800 0 0 0 0 0 0\n")
    (tmp_path / "meminfo").write_text("MemTotal: 1000 kB\nMemAvailable: 250 kB\n")
    host = agent_telemetry.Host(str(tmp_path))
    assert host.cpu_percent() == 0.0
    (tmp_path / "stat").write_text("cpu  150 0 150 900 0 0 0 0 0 0\n")
    assert host.cpu_percent() == 50.0
    assert host.memory() == (750 * 1024, 1000 * 1024)


def test_only_the_latest_sample_of_a_node_is_kept(sampled_node):
    now = timezone.now().timestamp()
    telemetry_store(
        samples={sampled_node.id: (now + 1, sample(sampled_node, {0: {"power_watts": 111.0}}))}
    )
    telemetry_store(
        samples={sampled_node.id: (now + 2, sample(sampled_node, {0: {"power_watts": 222.0}}))}
    )
    (row,) = NodeTelemetry.objects.filter(node=sampled_node)
    assert row.cards[0]["power_watts"] == 222.0 and len(row.cards) == 8
    assert row.host["cpu_percent"] == 12.5


@pytest.mark.parametrize(
    "bad",
    [
        {0: {"utilization_percent": 250.0}},
        {0: {"temperature_celsius": 1e9}},
        {0: {"memory_total_bytes": 2**62}},
        {0: {"uuid": "x" * 500}},
        {0: {"xid_counts": {str(code): 1 for code in range(100)}}},
    ],
)
def test_bad_telemetry_is_refused_for_its_node_alone(node_fleet, gpu_node, bad):
    good, liar = gpu_node(node_fleet), gpu_node(node_fleet, address="10.0.0.2:1")
    now = timezone.now().timestamp()
    done = telemetry_store(
        samples={good.id: (now, sample(good)), liar.id: (now, sample(liar, bad))}
    )
    assert done["refused"] == [liar.id] and done["stored"] == 1
    assert set(NodeTelemetry.objects.values_list("node_id", flat=True)) == {good.id}


def test_thousands_of_cards_in_a_sample_are_refused(sampled_node):
    many = [card({"index": i, "uuid": f"GPU-x{i}", "name": "H100"}) for i in range(5000)]
    done = telemetry_store(
        samples={sampled_node.id: (0.0, {**sample(sampled_node), "cards": many})}
    )
    assert done["refused"] == [sampled_node.id] and len(many) > MAX_CARDS
    assert (
        len(NodeTelemetry.objects.get(node=sampled_node).cards) == 8
    )  # its last good sample stays


@pytest.mark.django_db(transaction=True)
def test_a_flood_of_samples_from_one_node_is_one_row_a_flush(node_fleet, gpu_node):
    flooder, quiet = gpu_node(node_fleet), gpu_node(node_fleet, address="10.0.0.2:1")
    streams = Streams()
    for made in (flooder, quiet):
        streams.take(Stream(made.id, "session"))
    database = DatabaseThreads(1)
    batcher = TelemetryBatcher(streams, database=database)
    for watts in range(1, 10_001):
        flood = sample(flooder, {0: {"power_watts": float(watts % 900)}})
        batcher.take(flooder.id, wire.telemetry_message(flood).telemetry)
    batcher.take(quiet.id, wire.telemetry_message(sample(quiet)).telemetry)
    assert len(batcher.pending) == 2 and batcher.replaced == 9_999
    try:  # a loop of its own, in a thread: this worker may hold one already (Playwright's)
        with ThreadPoolExecutor(1) as runner:
            done = runner.submit(asyncio.run, batcher.flush()).result()
    finally:
        database.shutdown()
    assert done["stored"] == 2 and batcher.pending == {}, done
    assert NodeTelemetry.objects.get(node=flooder).cards[0]["power_watts"] == 10_000 % 900
    assert set(batcher.latest) == {flooder.id, quiet.id}


def test_the_api_shows_the_latest_sample_with_its_time_and_stale_as_stale(
    sampled_node,
    admin_api,
    settings,
):
    body = admin_api.get(f"/api/nodes/{sampled_node.id}").json()["telemetry"]
    assert body["stale"] is False and body["source"] == "file" and len(body["cards"]) == 8
    assert body["cards"][0]["health"] == "healthy" and body["cards"][0]["utilization_percent"] == 50
    assert body["observed_at"]

    def silent_for(intervals: int) -> dict:
        before = timezone.now() - timedelta(
            seconds=intervals * settings.TUNEPLANE_TELEMETRY_INTERVAL
        )
        NodeTelemetry.objects.filter(node=sampled_node).update(
            observed_at=before, cards_observed_at=before
        )
        return admin_api.get(f"/api/nodes/{sampled_node.id}").json()["telemetry"]

    # A steady node sends a sample only every refresh period: silent for most of one, it is
    # not stale; silent past it and two intervals' grace, it is.
    body = silent_for(TELEMETRY_REFRESH_INTERVALS + 1)
    assert body["stale"] is False and body["cards_stale"] is False
    body = silent_for(TELEMETRY_REFRESH_INTERVALS + 3)
    assert body["stale"] is True and body["cards_stale"] is True
    assert body["cards"][0]["utilization_percent"] == 50  # the last values, not zeros
