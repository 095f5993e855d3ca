"""The Fleet admin: New fleet, read-only kind and delivery, state actions, F4 and F7."""

import pytest

from audit.models import AuditEvent
from fleets.choices import FleetState
from fleets.deletion import register_deletion_blocker, unregister_deletion_blocker
from fleets.models import Fleet

ADD = "/admin/fleets/fleet/add/"
LIST = "/admin/fleets/fleet/"


@pytest.fixture
def staff(client, admin_user):
    client.force_login(admin_user)
    return client


# The quotas inline placement adds to the page (Q1), with no rows.
NO_QUOTAS = {"quotas-TOTAL_FORMS": "0", "quotas-INITIAL_FORMS": "0"}


def add_form(**fields):
    return {
        "id": "gpu-lab",
        "kind": "node",
        "delivery": "",
        "capabilities": ["train", "serve"],
        "visibility": "public",
        "project": "",
        "state": "active",
        "config": "{}",
        **NO_QUOTAS,
        **fields,
    }


def test_changelist_offers_new_fleet(staff):
    page = staff.get(LIST).content.decode()
    assert "New fleet" in page and "Add fleet" not in page
    add = staff.get(ADD).content.decode()
    assert "<h1>New fleet</h1>" in add


@pytest.mark.parametrize(
    "kind, delivery",
    [("node", "shared-mount"), ("slurm", "shared-mount"), ("kubernetes", "object-pull")],
)
def test_F2_admin_delivery_follows_the_kind(staff, kind, delivery):
    response = staff.post(ADD, add_form(kind=kind))
    assert response.status_code == 302, response.content.decode()[-2000:]
    fleet = Fleet.objects.get(pk="gpu-lab")
    assert fleet.delivery == delivery and fleet.capabilities == ["serve", "train"]
    event = AuditEvent.objects.get(action="fleet.created")
    assert event.actor_label == "ops"


def test_F1_change_page_shows_kind_and_delivery_read_only(staff, make_fleet):
    make_fleet("gpu-lab")
    page = staff.get(f"{LIST}gpu-lab/change/").content.decode()
    assert 'name="kind"' not in page and 'name="delivery"' not in page and 'name="id"' not in page
    assert "shared-mount" in page
    response = staff.post(
        f"{LIST}gpu-lab/change/",
        {
            "kind": "slurm",
            "delivery": "object-pull",
            "capabilities": ["env"],
            "visibility": "public",
            "project": "",
            "state": "active",
            "config": "{}",
            **NO_QUOTAS,
        },
    )
    assert response.status_code == 302
    fleet = Fleet.objects.get(pk="gpu-lab")
    assert (fleet.kind, fleet.delivery, fleet.capabilities) == ("node", "shared-mount", ["env"])
    assert AuditEvent.objects.filter(action="fleet.updated").count() == 1


def test_F4_unknown_key_saves_with_a_warning_naming_it(staff):
    response = staff.post(ADD, add_form(config='{"storag_root": "/mnt"}'), follow=True)
    assert Fleet.objects.get(pk="gpu-lab").config == {"storag_root": "/mnt"}
    warnings = [m.message for m in response.context["messages"] if m.level_tag == "warning"]
    assert len(warnings) == 1 and "storag_root" in warnings[0]


@pytest.mark.parametrize(
    "fields, error",
    [
        ({"config": '{"storage_root": 3}'}, "config.storage_root must be a string"),
        ({"config": "[1, 2]"}, "config must be a JSON object"),
        ({"config": "{not json"}, "Enter a valid JSON"),
        ({"visibility": "project"}, "a project Fleet must name its project"),
        ({"id": "Bad_Id"}, "lowercase"),
    ],
)
def test_admin_bad_input_is_a_form_error_and_saves_nothing(staff, fields, error):
    response = staff.post(ADD, add_form(**fields))
    assert response.status_code == 200
    assert error in response.content.decode()
    assert not Fleet.objects.exists() and not AuditEvent.objects.exists()


@pytest.mark.parametrize(
    "action, state", [("drain", "draining"), ("disable", "disabled"), ("activate", "active")]
)
def test_state_actions(staff, make_fleet, action, state):
    make_fleet("a", state=FleetState.DISABLED if state == "active" else "active")
    make_fleet("b", state=FleetState.DISABLED if state == "active" else "active")
    response = staff.post(LIST, {"action": action, "_selected_action": ["a", "b"]}, follow=True)
    assert response.status_code == 200
    assert set(Fleet.objects.values_list("state", flat=True)) == {state}
    assert AuditEvent.objects.filter(action="fleet.state_changed").count() == 2
    assert "Running work continues" in response.content.decode()


def test_F7_admin_delete_is_blocked_with_the_reason(staff, make_fleet):
    make_fleet("gpu-lab")

    def blocker(fleet):
        return ["1 live deployment (chat)"]

    register_deletion_blocker(blocker)
    try:
        response = staff.post(f"{LIST}gpu-lab/delete/", {"post": "yes"}, follow=True)
    finally:
        unregister_deletion_blocker(blocker)
    assert "cannot be deleted (rule F7)" in response.content.decode()
    assert "1 live deployment (chat)" in response.content.decode()
    assert Fleet.objects.filter(pk="gpu-lab").exists()


def test_F7_admin_delete_goes_through_the_service(staff, make_fleet):
    make_fleet("gpu-lab")
    assert "delete_selected" not in staff.get(LIST).content.decode()
    response = staff.post(f"{LIST}gpu-lab/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not Fleet.objects.exists()
    assert AuditEvent.objects.get(action="fleet.deleted").actor_label == "ops"


def test_non_staff_cannot_open_the_admin(client, member):
    client.force_login(member)
    assert client.get(LIST).status_code == 302  # to the admin login


def test_admin_changelist_query_count_is_flat(staff, make_fleet, django_assert_max_num_queries):
    for i in range(25):
        make_fleet(f"f{i}")
    staff.get(LIST)
    with django_assert_max_num_queries(12):
        assert staff.get(LIST).status_code == 200


def test_Q1_the_fleet_page_edits_its_quotas_as_a_whole_through_the_service(
    staff, make_fleet, project
):
    make_fleet("gpu-lab")
    form = {
        **add_form(),
        "quotas-TOTAL_FORMS": "1",
        "quotas-0-project": str(project.pk),
        "quotas-0-series": "",
        "quotas-0-guaranteed": "8",
        "quotas-0-limit": "16",
        "quotas-0-weight": "2",
    }
    del form["id"], form["kind"], form["delivery"]
    response = staff.post(f"{LIST}gpu-lab/change/", form)
    assert response.status_code == 302, response.content.decode()[-3000:]
    from placement.models import Quota

    quota = Quota.objects.get(fleet_id="gpu-lab")
    assert (quota.project, quota.guaranteed, quota.limit, quota.weight) == (project, 8, 16, 2)
    event = AuditEvent.objects.get(action="fleet.quotas_replaced")
    assert event.actor_label == "ops" and event.after["quotas"][0]["limit"] == 16
    page = staff.get(f"{LIST}gpu-lab/change/").content.decode()
    assert 'id="fleet-quotas"' in page and 'data-project="ml"' in page  # in fair-share order
    refused = {**form, "quotas-0-limit": "4"}  # below its guarantee: the form says so
    response = staff.post(f"{LIST}gpu-lab/change/", refused)
    assert response.status_code == 200 and Quota.objects.get(fleet_id="gpu-lab").limit == 16
