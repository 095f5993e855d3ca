"""The hardware registry in the API (J4): members read it, administrators write it, each
write audited, a mapping effective on every node without a re-join; and the card names of
Slurm's gres seeded, so that a Slurm Fleet places by series with no admin mapping each."""

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from fleets.models import Fleet
from nodes.backends.base import Machine
from nodes.models import CardAlias, ClusterSnapshot, HardwareSeries, Node
from nodes.selectors import card_series
from nodes.services.join import node_join
from placement.admission import Need, admit_automatically
from tests.conftest import H100_INVENTORY, make_csr


def audited(action: str) -> int:
    return AuditEvent.objects.filter(action=action).count()


def test_members_read_the_registry_and_anonymous_callers_do_not(member_api, anon_api):
    listed = member_api.get("/api/hardware-series?limit=1000").json()["results"]
    h100 = next(series for series in listed if series["slug"] == "h100")
    assert "NVIDIA H100 80GB HBM3" in h100["card_names"] and h100["vendor"] == "nvidia"
    assert member_api.get("/api/hardware-series/h100").json()["name"] == "NVIDIA H100"
    names = member_api.get("/api/card-names?limit=1000").json()["results"]
    assert {"name": "h100", "series": "h100"}.items() <= next(
        n for n in names if n["name"] == "h100"
    ).items()
    for path in ("/api/hardware-series", "/api/card-names", "/api/hardware-series/h100"):
        assert anon_api.get(path).status_code == 401
    assert member_api.get("/api/hardware-series/nope").status_code == 404
    assert member_api.get("/api/card-names?mapped=maybe").json()["error"]["field"] == "mapped"


def test_F5_only_administrators_write_the_registry(member_api):
    alias = CardAlias.objects.create(name="Mystery X1")
    before = AuditEvent.objects.count()
    attempts = [
        member_api.post("/api/hardware-series", {"slug": "x1", "name": "X1"}),
        member_api.patch("/api/hardware-series/h100", {"name": "renamed"}),
        member_api.delete("/api/hardware-series/h100"),
        member_api.post("/api/card-names", {"name": "Mystery X2"}),
        member_api.patch(f"/api/card-names/{alias.pk}", {"series": "h100"}),
        member_api.delete(f"/api/card-names/{alias.pk}"),
    ]
    assert [response.status_code for response in attempts] == [403] * 6
    assert AuditEvent.objects.count() == before
    assert CardAlias.objects.get(pk=alias.pk).series is None


def test_A1_series_writes_are_audited_and_name_the_field_at_fault(admin_api):
    made = admin_api.post(
        "/api/hardware-series", {"slug": "ascend-910c", "name": "Ascend 910C", "vendor": "huawei"}
    )
    assert made.status_code == 201 and made.json()["card_names"] == []
    assert audited("hardware_series.created") == 1
    for body in ({"slug": "4090", "name": "digits"}, {"slug": "h100", "name": "again"}):
        refused = admin_api.post("/api/hardware-series", body)
        assert refused.status_code == 400 and refused.json()["error"]["field"] == "slug", body
    fixed = admin_api.patch("/api/hardware-series/ascend-910c", {"slug": "ascend"})
    assert fixed.status_code == 400 and fixed.json()["error"]["field"] == "slug"
    renamed = admin_api.patch("/api/hardware-series/ascend-910c", {"name": "Huawei Ascend 910C"})
    assert renamed.json()["name"] == "Huawei Ascend 910C"
    assert audited("hardware_series.updated") == 1
    assert admin_api.delete("/api/hardware-series/h100").json()["error"]["rule"] == "J4"
    assert admin_api.delete("/api/hardware-series/ascend-910c").status_code == 204
    assert audited("hardware_series.deleted") == 1


def test_J4_mapping_a_card_name_through_the_api_moves_joined_nodes_without_a_rejoin(
    admin_api, node_fleet, mint
):
    inventory = {**H100_INVENTORY, "cards": [{"name": "Mystery X1", "count": 4}]}
    node = node_join(
        token=mint(node_fleet)[1], fleet_id=node_fleet.id, csr=make_csr()[1], inventory=inventory
    ).node
    unmapped = admin_api.get("/api/card-names?mapped=false").json()["results"]
    alias = next(name for name in unmapped if name["name"] == "Mystery X1")
    assert alias["series"] is None and alias["first_seen_at"]
    bad = admin_api.patch(f"/api/card-names/{alias['id']}", {"series": "nope"})
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "series"
    mapped = admin_api.patch(f"/api/card-names/{alias['id']}", {"series": "h100"})
    assert mapped.json()["series"] == "h100"
    assert Node.objects.get(pk=node.pk).series_cards == {"h100": 4}
    shown = admin_api.get(f"/api/nodes/{node.id}").json()["inventory"]["cards"]
    assert shown == [{"name": "Mystery X1", "count": 4, "series": "h100"}]
    event = AuditEvent.objects.get(action="card_alias.mapped")
    assert (event.before, event.after) == ({"series": None}, {"series": "h100", "nodes": 1})
    refused = admin_api.delete(f"/api/card-names/{alias['id']}")
    assert refused.status_code == 409 and refused.json()["error"]["rule"] == "J4"
    admin_api.patch(f"/api/card-names/{alias['id']}", {"series": None})
    assert Node.objects.get(pk=node.pk).series_cards == {}
    assert admin_api.delete(f"/api/card-names/{alias['id']}").status_code == 204


def test_J4_a_card_name_added_by_hand_is_mapped_with_it(admin_api):
    made = admin_api.post("/api/card-names", {"name": "NVIDIA GB200", "series": "b200"})
    assert made.status_code == 201 and made.json()["series"] == "b200"
    assert audited("card_alias.added") == audited("card_alias.mapped") == 1
    again = admin_api.post("/api/card-names", {"name": "NVIDIA GB200"})
    assert again.status_code == 400 and again.json()["error"]["field"] == "name"


@pytest.mark.parametrize(
    "gres, series",
    [("h100", "h100"), ("h200", "h200"), ("a100", "a100"), ("a100_80gb", "a100-80gb"),
     ("l40s", "l40s"), ("a10", "a10"), ("v100", "v100"), ("mi300x", "mi300x")],
)  # fmt: skip
def test_J4_slurm_gres_types_are_seeded_mapped(db, gres, series):
    assert card_series([gres]) == {gres: series}


def test_J4_a_bare_a100_is_never_taken_for_80_gb(db):
    assert card_series(["a100"]) == {"a100": "a100"}
    assert HardwareSeries.objects.filter(slug__in=["a100", "a100-80gb", "a100-40gb"]).count() == 3


def test_P1_a_slurm_fleet_places_by_series_with_no_admin_mapping(make_fleet, project):
    fleet = make_fleet("hpc", kind="slurm", capabilities=["train"], config={})
    machines = [Machine(name="node-01", cards=[{"name": "h100", "count": 8}]).as_dict()]
    ClusterSnapshot.objects.create(
        fleet=fleet, machines=machines, observed_at=timezone.now(), attempted_at=timezone.now()
    )
    admitted = admit_automatically(project, Need("train", "h100", 8))
    assert admitted.fleet_id == "hpc" and admitted.nodes == ["node-01"]
    assert Fleet.objects.count() == 1
