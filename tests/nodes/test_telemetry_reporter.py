"""Report by exception (issue 19): the agent samples every interval and sends a sample only
when it says something new — the first of a stream, a change to the cards' health at once, a
figure beyond its deadband, else every refresh period — and the console's health, judged
from the samples sent, comes out as it did when every sample was sent."""

import copy

import pytest
from django.utils import timezone

from nodes.agent import telemetry
from nodes.agent.wire import TELEMETRY_REFRESH_INTERVALS
from nodes.models import Node
from nodes.services.telemetry import telemetry_store
from tests.nodes.gpu_samples import card

INTERVAL = 15.0
DEVICES = [{"index": i, "uuid": f"GPU-{i}", "name": "NVIDIA H100 80GB HBM3"} for i in range(2)]
GIB = 2**30


def steady(**host) -> dict:
    return {
        "source": "nvml",
        "cards": [card(device) for device in DEVICES],
        "cpu_percent": 20.0,
        "memory_used_bytes": 100 * GIB,
        "memory_total_bytes": 1000 * GIB,
        **host,
    }


def changed(index: int, **values) -> dict:
    """The steady sample with one card's values changed."""
    moved = steady()
    moved["cards"][index].update(values)
    return moved


@pytest.fixture
def reporter() -> telemetry.Reporter:
    started = telemetry.Reporter(INTERVAL)
    assert started.due(steady(), 0.0), "the first sample of a stream is always sent"
    return started


def test_the_first_sample_of_a_stream_is_sent_and_an_unchanged_one_is_not(reporter):
    assert not any(reporter.due(steady(), k * INTERVAL) for k in range(1, 19))


def test_a_new_stream_sends_its_first_sample_again(reporter):
    assert not reporter.due(steady(), INTERVAL)
    assert telemetry.Reporter(INTERVAL).due(steady(), 2 * INTERVAL)


@pytest.mark.parametrize(
    "inside, beyond",
    [
        ({"utilization_percent": 59.0}, {"utilization_percent": 60.0}),  # 50 %, 10 points
        ({"utilization_percent": 41.0}, {"utilization_percent": 40.0}),
        ({"memory_used_bytes": 4 * GIB}, {"memory_used_bytes": 5 * GIB}),  # 1 of 80 GiB, 5 %
        ({"temperature_celsius": 64.0}, {"temperature_celsius": 65.0}),  # 60 °C, 5 °C
        ({"power_watts": 329.0}, {"power_watts": 330.0}),  # 300 W, 10 % of it
        ({"power_watts": 271.0}, {"power_watts": 270.0}),
    ],
)
def test_a_card_figure_inside_its_deadband_is_kept_beyond_it_sent(reporter, inside, beyond):
    assert not reporter.due(changed(1, **inside), INTERVAL)
    assert reporter.due(changed(1, **beyond), 2 * INTERVAL)


def test_an_idle_cards_power_wanders_within_a_floor(reporter):
    idle = telemetry.Reporter(INTERVAL)
    assert idle.due(changed(0, power_watts=60.0), 0.0)
    assert not idle.due(changed(0, power_watts=69.0), INTERVAL)  # 15 %, under 10 W
    assert idle.due(changed(0, power_watts=70.0), 2 * INTERVAL)


def test_the_deadband_is_from_the_last_sample_sent_not_the_last_taken(reporter):
    """A slow drift is sent once it adds up, not lost a step at a time."""
    drift = [changed(0, temperature_celsius=60.0 + step) for step in (2, 4, 5)]
    assert [reporter.due(one, k * INTERVAL) for k, one in enumerate(drift, 1)] == [
        False,
        False,
        True,
    ]


@pytest.mark.parametrize(
    "inside, beyond",
    [
        ({"cpu_percent": 29.9}, {"cpu_percent": 30.0}),
        ({"memory_used_bytes": 149 * GIB}, {"memory_used_bytes": 150 * GIB}),  # 5 % of 1000
    ],
)
def test_a_host_figure_inside_its_deadband_is_kept_beyond_it_sent(reporter, inside, beyond):
    assert not reporter.due(steady(**inside), INTERVAL)
    assert reporter.due(steady(**beyond), 2 * INTERVAL)


@pytest.mark.parametrize(
    "fault",
    [
        changed(0, xid_counts={79: 1}),
        changed(1, xid_counts={13: 1}),  # not a fatal one: the console judges, not the agent
        changed(0, ecc_uncorrected=1),
        changed(0, ecc_corrected=1),
        changed(0, memory_total_bytes=40 * GIB),
        {**steady(), "cards": [card(DEVICES[0])]},  # a card missing
        {**steady(), "cards": [*steady()["cards"], card({**DEVICES[1], "uuid": "GPU-9"})]},
        {**steady(), "source": "", "cards": []},  # the probe failed
    ],
    ids=[
        "xid",
        "other-xid",
        "ecc-uncorrected",
        "ecc-corrected",
        "total",
        "missing",
        "new",
        "probe",
    ],
)
def test_a_change_to_the_cards_health_is_sent_at_once_however_small(reporter, fault):
    assert reporter.due(fault, INTERVAL)
    assert not reporter.due(copy.deepcopy(fault), 2 * INTERVAL)
    assert reporter.due(steady(), 3 * INTERVAL), "and its going back too"


def test_a_probe_recovering_is_sent_at_once():
    failing = telemetry.Reporter(INTERVAL)
    assert failing.due({**steady(), "source": "", "cards": []}, 0.0)
    assert failing.due(steady(), INTERVAL)


def test_an_unchanged_sample_is_sent_every_refresh_period(reporter):
    sent = [k for k in range(1, 3 * TELEMETRY_REFRESH_INTERVALS + 1)
            if reporter.due(steady(), k * INTERVAL)]  # fmt: skip
    refresh = TELEMETRY_REFRESH_INTERVALS
    assert sent == [refresh, 2 * refresh, 3 * refresh]


def test_a_refresh_is_not_put_off_by_a_probe_a_little_faster_than_the_first(reporter):
    assert reporter.due(steady(), TELEMETRY_REFRESH_INTERVALS * INTERVAL - 0.2)


def test_a_sample_sent_for_news_restarts_the_refresh_period(reporter):
    assert reporter.due(changed(0, utilization_percent=90.0), 5 * INTERVAL)
    later = changed(0, utilization_percent=90.0)
    assert not reporter.due(later, TELEMETRY_REFRESH_INTERVALS * INTERVAL)
    assert reporter.due(later, (5 + TELEMETRY_REFRESH_INTERVALS) * INTERVAL)


def test_the_file_source_may_hold_the_hosts_figures_steady(tmp_path):
    path = tmp_path / "telemetry.json"
    host = {"cpu_percent": 7.5, "memory_used_bytes": 2**33, "memory_total_bytes": 2**36}
    path.write_text(f'{{"cards": [], "host": {str(host).replace(chr(39), chr(34))}}}')
    got = telemetry.sample(telemetry.FileSource(str(path)), telemetry.Host(), DEVICES)
    assert {key: got[key] for key in host} == host


def placeable_as_stored(node: Node, samples: list[dict], *, every_sample: bool) -> list:
    """Samples taken every interval, stored as sent (all, or the Reporter's), and the node's
    placeable cards after each."""
    reporter = telemetry.Reporter(INTERVAL)
    start = timezone.now().timestamp()
    counts = []
    for k, taken in enumerate(samples):
        if every_sample or reporter.due(taken, k * INTERVAL):
            telemetry_store(samples={node.id: (start + k * INTERVAL, taken)})
        counts.append(Node.objects.get(pk=node.pk).card_count)
    return counts


@pytest.mark.parametrize(
    "fault", [{"xid_counts": {"79": 1}}, {"ecc_uncorrected": 2}, None], ids=["xid", "ecc", "gone"]
)
def test_health_judged_from_the_samples_sent_is_the_health_of_every_sample(
    node_fleet,
    gpu_node,
    settings,
    fault,
):
    """A card out of placement at the very sample that shows the fault (or its absence),
    and back — by the quiet period — at the latest one refresh later than with every sample."""
    settings.TUNEPLANE_GPU_HEALTH_QUIET = 8 * INTERVAL

    def samples(node: Node) -> list[dict]:
        taken = []
        for k in range(60):
            shown = [card(device) for device in node.inventory["devices"]]
            if k >= 4 and fault:
                shown[3].update(fault)
            if 4 <= k < 6 and not fault:
                del shown[3]  # fallen off the bus for two samples
            taken.append({"source": "file", "cards": shown, "cpu_percent": 10.0,
                          "memory_used_bytes": 2**34, "memory_total_bytes": 2**39})  # fmt: skip
        return taken

    one, other = (
        gpu_node(node_fleet, address="10.0.0.1:1"),
        gpu_node(node_fleet, address="10.0.0.2:1"),
    )
    every = placeable_as_stored(one, samples(one), every_sample=True)
    sent = placeable_as_stored(other, samples(other), every_sample=False)
    assert every[:4] == sent[:4] == [8] * 4
    assert every[4] == sent[4] == 7, "out at the sample that shows it"
    back_every, back_sent = every.index(8, 4), sent.index(8, 4)
    assert back_every <= back_sent <= back_every + TELEMETRY_REFRESH_INTERVALS
    assert sent[back_sent:] == [8] * (len(sent) - back_sent)
