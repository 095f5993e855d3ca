"""What waits by its reason (Q8) and each Fleet's cards by hardware series, held until the
cleanup (R1, R7), as the web's /metrics answers them at a scrape: what the dashboard's
queue and cards panels read (deploy/grafana/tuneplane.json)."""

from django.test import Client

from placement.services.allocator import allocate
from tests.placement.test_quotas import submit
from tests.placement.test_running_rules import members_of, report
from tests.tuneplane.test_metrics import scrape, value


def test_Q8_R1_R7_waiting_work_by_reason_and_cards_by_series_held_and_free(
    node_fleet, gpu_node, member
):
    gpu_node(node_fleet)
    placed = submit(member, "ml", "placed", cards=2, series="h100")
    submit(member, "ml", "waits", cards=8)
    allocate(fleet_id=node_fleet.id)  # 2 held; the 8-card job waits behind it
    allocate(fleet_id=node_fleet.id)  # its reason, read again: capacity
    figures = scrape(Client(REMOTE_ADDR="127.0.0.1"))
    lab = {"fleet": "gpu-lab"}
    assert value(figures, "tuneplane_waiting", **lab, kind="job", reason="capacity") == 1
    assert value(figures, "tuneplane_gpu_cards_series", **lab, series="h100", state="held") == 2
    assert value(figures, "tuneplane_gpu_cards_series", **lab, series="h100", state="free") == 6
    # R7: held until its node confirms the cleanup, then free again.
    [one] = members_of(placed)
    report(one, "succeeded", 0, "exit")
    held = value(
        scrape(Client(REMOTE_ADDR="127.0.0.1")),
        "tuneplane_gpu_cards_series",
        **lab,
        series="h100",
        state="held",
    )
    assert held == 2
    report(one, "succeeded", 0, "exit", cleaned=True)
    allocate(fleet_id=node_fleet.id)  # the waiting job takes all 8
    figures = scrape(Client(REMOTE_ADDR="127.0.0.1"))
    assert value(figures, "tuneplane_gpu_cards_series", **lab, series="h100", state="held") == 8
    assert value(figures, "tuneplane_waiting", **lab, kind="job", reason="capacity") == 0
