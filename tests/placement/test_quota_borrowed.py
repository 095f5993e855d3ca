"""What a quota borrows (Q3): what it holds above its guarantee now, one number everywhere it
is reported — the quotas' API, the admin's Fleet page, the ``tuneplane_quota_borrowed``
gauge (issue 49: a project holding 2 cards with a guarantee of 1 was shown borrowing 2,
the cards of its members placed as borrowed). Which running work preemption may take is
each member's own mark (Q4, Q5) and stays so. The rule without a database first, then the
three readers on the real database, at its boundaries."""

import re

import pytest
from django.test import Client

from placement.models import Member
from placement.services.allocator import allocate
from placement.sharing import Book, QuotaRow, borrowed
from tests.placement.test_quotas import QUOTAS, submit
from tests.tuneplane.test_metrics import scrape

A, B = 1, 2


@pytest.fixture
def lab(node_fleet, gpu_node):
    gpu_node(node_fleet)
    return node_fleet


@pytest.mark.parametrize(
    ("held", "guaranteed", "expected"),
    [(0, 0, 0), (1, 2, 0), (2, 2, 0), (3, 2, 1), (2, 1, 1), (8, 0, 8)],
    ids=["nothing", "below", "equal", "one-above", "issue-49", "no-guarantee"],
)
def test_Q3_a_quota_borrows_what_it_holds_above_its_guarantee_now(held, guaranteed, expected):
    assert borrowed(held, guaranteed) == expected
    book = Book(rows={(A, ""): QuotaRow(guaranteed=guaranteed)}, held={(A, ""): held})
    assert book.borrowed((A, "")) == expected


def test_Q3_without_a_quota_row_all_it_holds_is_borrowed_and_each_series_counts_apart():
    book = Book(
        rows={(A, "h100"): QuotaRow(guaranteed=1), (A, ""): QuotaRow(guaranteed=4)},
        held={(A, "h100"): 2, (A, ""): 1, (B, ""): 3},
    )
    # A's any-card guarantee left unused lends nothing to its H100 row, nor the reverse.
    assert (book.borrowed((A, "h100")), book.borrowed((A, ""))) == (1, 0)
    assert book.borrowed((B, "")) == 3  # no row: guaranteed 0 (Q1)
    assert book.borrowed((B, "h100")) == 0  # holds none there


def _admin_rows(admin_client) -> list[tuple[str, str, int, int]]:
    """The admin's Fleet page's quota rows: (project, series, in use, borrowed)."""
    page = admin_client.get("/admin/fleets/fleet/gpu-lab/change/").content.decode()
    rows = re.findall(
        r'<tr data-project="([^"]+)">\s*<td>[^<]*</td>\s*<td>([^<]*)</td>.*?'
        r'class="quota-in-use">(\d+)</td>\s*<td class="quota-borrowed">(\d+)</td>',
        page,
        flags=re.S,
    )
    return sorted((p, "" if s == "any card" else s, int(u), int(b)) for p, s, u, b in rows)


def _api_rows(admin_api) -> list[tuple[str, str, int, int]]:
    return sorted(
        (r["project"], r["series"], r["in_use"], r["borrowed"])
        for r in admin_api.get(QUOTAS).json()["quotas"]
    )


def _gauge_rows() -> list[tuple[str, str, int, int]]:
    figures = scrape(Client(REMOTE_ADDR="127.0.0.1"))
    shown: dict = {}
    for (name, labels), figure in figures.items():
        labels = dict(labels)
        if name in ("tuneplane_quota_in_use", "tuneplane_quota_borrowed"):
            key = (labels["project"], labels["series"])
            shown.setdefault(key, {})[name.rsplit("_", 1)[1]] = int(figure)
    return sorted((p, s, fig["use"], fig["borrowed"]) for (p, s), fig in shown.items())


def _everywhere(admin_api, admin_client) -> list[tuple[str, str, int, int]]:
    api = _api_rows(admin_api)
    assert _admin_rows(admin_client) == api
    assert _gauge_rows() == api
    return api


@pytest.mark.parametrize(
    ("guaranteed", "expected"),
    [(3, 0), (2, 0), (1, 1), (0, 2)],
    ids=["below", "equal", "guarantee+1", "none"],
)
def test_Q3_the_api_the_admin_and_the_gauge_say_one_borrowed_number(
    lab, admin_api, admin_client, member, guaranteed, expected
):
    """ml's 2-card job is placed beyond a guarantee of 1 (its member marked borrowed, so
    preemption may take it); what ml borrows is what it holds above its guarantee now."""
    admin_api.request("PUT", QUOTAS, {"quotas": [{"project": "ml", "guaranteed": 1}]})
    job = submit(member, "ml", "two", cards=2)
    allocate(fleet_id=lab.id)
    assert Member.objects.get(attempt__training_job=job).borrowed  # Q4: still preemptible
    body = {"quotas": [{"project": "ml", "guaranteed": guaranteed}]}
    assert admin_api.request("PUT", QUOTAS, body).status_code == 200
    assert _everywhere(admin_api, admin_client) == [("ml", "", 2, expected)]


def test_Q3_two_series_and_a_project_without_a_quota_row_agree_everywhere(
    lab, admin_api, admin_client, member, vision
):
    """ml holds 2 H100s against its H100 row (guaranteed 1) and 1 card against its any-card
    row (guaranteed 0); cv, without a row, holds 1 card and is in no reader's rows."""
    quotas = [
        {"project": "ml", "series": "h100", "guaranteed": 1},
        {"project": "ml", "series": "", "guaranteed": 0},
    ]
    assert admin_api.request("PUT", QUOTAS, {"quotas": quotas}).status_code == 200
    submit(member, "ml", "pinned", cards=2, series="h100")
    submit(member, "ml", "any", cards=1)
    submit(vision, "cv", "rowless", cards=1)
    allocate(fleet_id=lab.id)
    assert Member.objects.count() == 3
    assert _everywhere(admin_api, admin_client) == [("ml", "", 1, 1), ("ml", "h100", 2, 1)]
