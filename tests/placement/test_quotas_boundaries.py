"""A Fleet's quotas (placement.services.quotas) on the boundaries a mutant moved (issue 47):
what a refused PUT says, word for word and by field (Q1); the rows read back in one order,
from the service as from the API, the same again included (Q1); one replace at a time per
Fleet, asking for a pass when it changed something (Q1, Q3); queued cards summed on their
own Fleet, a gang's on every node, against its series' quota (Q1, Q2); the fair share by
the configured half-life and the quota's weight, to three places (Q3); the rows read in the
same queries whatever their number (Q1). Each test was seen failing against the mutants it
names."""

from unittest.mock import call, patch

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from placement.models import TrainingJob, Usage
from placement.services.ledger import fair_share_tau
from placement.services.quotas import QuotaSpec, quota_rows, quotas_replace
from tests.conftest import SYSTEM
from tests.placement.test_quotas import QUOTAS, submit


@pytest.fixture
def lab(node_fleet, gpu_node):
    gpu_node(node_fleet)
    return node_fleet


def refusal(admin_api, quotas: list[dict]) -> tuple[str, str]:
    response = admin_api.request("PUT", QUOTAS, {"quotas": quotas})
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    return error["field"], error["message"]


def test_Q1_each_refused_row_is_named_by_its_field_and_said_in_full(lab, admin_api, project):
    """x_quotas_replace__mutmut_17–_20, _23–_26, _34, _35, _37–_43: the message and field
    of each refusal, the limit's with its parenthesis, a duplicate's with its series."""
    assert refusal(admin_api, [{"project": "nope"}]) == (
        "quotas[0].project",
        "quotas[0].project: no project 'nope'.",
    )
    assert refusal(admin_api, [{"project": "ml"}, {"project": "ml", "series": "h99"}]) == (
        "quotas[1].series",
        "quotas[1].series: no hardware series 'h99' (\"\" for any card).",
    )
    assert refusal(admin_api, [{"project": "ml", "guaranteed": 3, "limit": 2}]) == (
        "quotas[0].limit",
        "quotas[0].limit: 2 is less than its guaranteed 3 "
        "(a limit is at least the guarantee, or null for unlimited).",
    )
    assert refusal(admin_api, [{"project": "ml"}, {"project": "ml", "guaranteed": 1}]) == (
        "quotas[1]",
        "quotas[1]: project 'ml' has a quota for any card already.",
    )
    pinned = [{"project": "ml", "series": "h100"}, {"project": "ml", "series": "h100"}]
    assert refusal(admin_api, pinned) == (
        "quotas[1]",
        "quotas[1]: project 'ml' has a quota for h100 already.",
    )


def test_Q1_a_limit_equal_to_its_guarantee_is_taken(lab, admin_api, project):
    """The boundary of "a limit is at least the guarantee" (x_quotas_replace__mutmut_29)."""
    response = admin_api.request(
        "PUT", QUOTAS, {"quotas": [{"project": "ml", "guaranteed": 4, "limit": 4}]}
    )
    assert response.status_code == 200, response.content
    assert [(r["guaranteed"], r["limit"]) for r in response.json()["quotas"]] == [(4, 4)]


def test_Q1_the_service_returns_the_quotas_by_project_then_series_the_same_again_too(
    lab, project, vision
):
    """Written in neither order and returned by project first (x_fleet_quotas__mutmut_12:
    by series alone), then the same again returned, not nothing
    (x_quotas_replace__mutmut_70, _104)."""
    specs = [
        QuotaSpec(project="ml", series="h100", guaranteed=2),
        QuotaSpec(project="ml"),
        QuotaSpec(project="cv", series="h100", limit=8),
    ]
    expected = [("cv", "h100", 0, 8), ("ml", "", 0, None), ("ml", "h100", 2, None)]
    for _ in range(2):
        quotas = quotas_replace(actor=SYSTEM, fleet=lab, specs=specs)
        assert [(q.project.slug, q.series, q.guaranteed, q.limit) for q in quotas] == expected


def _replaced_twice(lab):
    """The same quotas replaced twice: the allocator's pass asked for, and the queries."""
    specs = [QuotaSpec(project="ml", guaranteed=2)]
    with (
        patch("placement.services.quotas.allocate_on_commit") as allocating,
        CaptureQueriesContext(connection) as captured,
    ):
        quotas_replace(actor=SYSTEM, fleet=lab, specs=specs)
        quotas_replace(actor=SYSTEM, fleet=lab, specs=specs)  # the same: no pass
    return allocating.call_args_list, [q["sql"] for q in captured]


def test_Q1_a_replace_asks_for_a_pass_only_when_it_changed_something(lab, project):
    """A new quota may let waiting work start: a pass for this Fleet, once
    (x_quotas_replace__mutmut_103)."""
    passes, _ = _replaced_twice(lab)
    assert passes == [call(lab.id)]


@pytest.mark.postgres  # SQLite has no row locks: Django leaves FOR UPDATE out there
def test_Q1_a_replace_locks_its_fleet(lab, project):
    """One replace at a time per Fleet (x_quotas_replace__mutmut_45: the lock taken on no
    row)."""
    _, queries = _replaced_twice(lab)
    locks = [sql for sql in queries if "FOR UPDATE" in sql]
    assert len(locks) == 2 and all(f"= '{lab.id}'" in sql for sql in locks), locks


def test_Q1_Q2_a_queued_gang_counts_its_cards_on_every_node_against_its_series_quota(
    node_fleet, two_nodes, admin_api, member, project, make_fleet
):
    """2 cards × 2 nodes queues 4 cards (x_quota_rows__mutmut_66: 2 / 2); a job pinned to
    a series with a quota of its own counts there, jobs for any card on the any-card row,
    summed (x_quota_rows__mutmut_56: every job on its any-card row; _61: the last job
    alone); another Fleet's queued job not at all (_44)."""
    admin_api.request(
        "PUT", QUOTAS, {"quotas": [{"project": "ml"}, {"project": "ml", "series": "h100"}]}
    )
    submit(member, "ml", "gang", cards=2, nodes=2, series="h100")
    submit(member, "ml", "one", cards=3)
    submit(member, "ml", "two", cards=1)
    elsewhere = submit(member, "ml", "elsewhere", cards=5)
    TrainingJob.objects.filter(pk=elsewhere.pk).update(fleet=make_fleet("other-lab"))
    rows = {r["series"]: (r["in_use"], r["queued"]) for r in quota_rows(node_fleet)}
    assert rows == {"": (0, 4), "h100": (0, 4)}
    assert all(isinstance(r["queued"], int) for r in quota_rows(node_fleet))


def test_Q3_the_fair_share_is_use_by_the_configured_half_life_over_the_weight(
    lab, admin_api, project, settings
):
    """A project that used τ card-seconds holds one card's worth: over a weight of 3, a
    share of 0.333 — three places (x_quota_rows__mutmut_88–_90, _92), the weight read
    (_19, _21, _22), τ the configured half-life's, not the default week's (_12, _16), the use
    read (_11, _15, _23–_32)."""
    settings.TUNEPLANE_FAIR_SHARE_HALF_LIFE = 86400
    admin_api.request("PUT", QUOTAS, {"quotas": [{"project": "ml", "weight": 3}]})
    Usage.objects.create(
        fleet=lab, project=project, card_seconds=fair_share_tau(), as_of=timezone.now()
    )
    [row] = quota_rows(lab)
    assert (row["weight"], row["fair_share"]) == (3, 0.333)


def test_Q1_the_rows_are_read_in_the_same_queries_whatever_their_number(
    lab, admin_api, project, vision
):
    """Each row's project comes with its quota (x_fleet_quotas__mutmut_2: one query more
    per row)."""
    admin_api.request("PUT", QUOTAS, {"quotas": [{"project": "ml"}]})
    with CaptureQueriesContext(connection) as one:
        assert len(quota_rows(lab)) == 1
    admin_api.request(
        "PUT", QUOTAS, {"quotas": [{"project": "ml"}, {"project": "cv", "series": "h100"}]}
    )
    with CaptureQueriesContext(connection) as two:
        assert len(quota_rows(lab)) == 2
    assert len(two) == len(one)
