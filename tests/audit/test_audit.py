"""A1: one audit event per change, never edited or deleted through any interface."""

import pytest
from django.db import DatabaseError, connection, transaction

from audit.models import AppendOnly, AuditEvent
from audit.services import Actor, audit_record
from fleets.choices import FleetState
from fleets.models import Fleet


@pytest.fixture
def event(make_fleet):
    make_fleet("gpu-lab")
    return AuditEvent.objects.get(action="fleet.created")


def test_A1_create_records_who_what_target_when_and_after(admin_api):
    admin_api.post(
        "/api/fleets",
        {"id": "gpu-lab", "kind": "node", "capabilities": ["train"]},
        HTTP_X_REQUEST_ID="req-1",
    )
    event = AuditEvent.objects.get(action="fleet.created")
    assert (event.actor_type, event.actor_label) == ("user", "ops")
    assert (event.target_type, event.target_id) == ("fleets.fleet", "gpu-lab")
    assert event.before is None and event.after["capabilities"] == ["train"]
    assert event.forced is False and event.correlation_id == "req-1" and event.at is not None


def test_A1_state_changes_are_audited(admin_api, make_fleet):
    from fleets.services import fleet_set_state

    fleet = make_fleet("gpu-lab")
    fleet_set_state(actor=Actor.system("tests"), fleet=fleet, state=FleetState.DRAINING)
    event = AuditEvent.objects.get(action="fleet.state_changed")
    assert (event.before["state"], event.after["state"]) == ("active", "draining")
    assert event.actor_type == "system"


@pytest.mark.django_db(transaction=True)
def test_A1_audit_outside_a_transaction_is_a_programming_error():
    fleet = Fleet.objects.create(id="gpu-lab", kind="node", delivery="shared-mount")
    with pytest.raises(RuntimeError, match="inside the change's transaction"):
        audit_record(actor=Actor.system("t"), action="fleet.created", target=fleet)
    assert not AuditEvent.objects.exists()


def test_A1_orm_refuses_to_edit_or_delete(event):
    event.action = "rewritten"
    with pytest.raises(AppendOnly):
        event.save()
    with pytest.raises(AppendOnly):
        event.delete()
    with pytest.raises(AppendOnly):
        AuditEvent.objects.filter(pk=event.pk).update(action="rewritten")
    with pytest.raises(AppendOnly):
        AuditEvent.objects.all().delete()


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE audit_auditevent SET action = 'rewritten'",
        pytest.param("DELETE FROM audit_auditevent", marks=pytest.mark.postgres),
    ],
)
def test_A1_database_refuses_to_edit_or_delete(event, statement):
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(statement)
    assert AuditEvent.objects.get(pk=event.pk).action == "fleet.created"


def test_A1_api_is_read_only_and_admin_only(admin_api, member_api, event):
    listed = admin_api.get("/api/audit?target_id=gpu-lab&action=fleet.created").json()
    assert [e["id"] for e in listed["results"]] == [event.pk]
    assert listed["results"][0]["target"] == {"type": "fleets.fleet", "id": "gpu-lab"}
    assert admin_api.get("/api/audit?action=fleet.deleted").json()["count"] == 0
    for method in ("POST", "PATCH", "PUT", "DELETE"):
        assert admin_api.request(method, "/api/audit", {}).status_code == 405
    assert member_api.get("/api/audit").status_code == 403


def test_A1_admin_offers_no_add_change_or_delete(client, admin_user, event):
    client.force_login(admin_user)
    assert client.get("/admin/audit/auditevent/").status_code == 200
    assert client.get("/admin/audit/auditevent/add/").status_code == 403
    assert client.post(f"/admin/audit/auditevent/{event.pk}/delete/").status_code == 403
    change = client.post(f"/admin/audit/auditevent/{event.pk}/change/", {"action": "x"})
    assert change.status_code == 403
    page = client.get(f"/admin/audit/auditevent/{event.pk}/change/").content.decode()
    assert 'name="action"' not in page  # shown, not editable
    assert AuditEvent.objects.get(pk=event.pk).action == "fleet.created"


def test_A1_audit_list_query_count_is_flat(admin_api, make_fleet, django_assert_max_num_queries):
    admin_api.get("/api/audit")
    for i in range(30):
        make_fleet(f"f{i}")
    with django_assert_max_num_queries(3):
        assert admin_api.get("/api/audit").json()["count"] >= 30
    assert Fleet.objects.count() == 30
