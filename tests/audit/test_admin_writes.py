"""A1 in the admin: every way the admin writes goes through a service that records its event.

The writing admins are found, not listed by hand: every registered ModelAdmin (and inline)
that lets a staff user add, change or delete must override Django's own save or delete with
one of ours — which calls a service — or be named in NOT_OURS with the reason. A new admin
that saves with Django's default fails here until it calls a service. The paths the issue
found unaudited (memberships, hardware series, card names added by hand) are then driven
through the admin itself, as an operator would, and their events looked for.
"""

import pytest
from django.contrib import admin
from django.contrib.admin.options import InlineModelAdmin, ModelAdmin
from django.test import RequestFactory

from audit.models import AuditEvent
from nodes.models import CardAlias, HardwareSeries
from tuneplane.models import Membership, Project

# Records that are not a Fleet, token, node or workload: Django's own accounts, and the
# schedule of background work that django-celery-beat keeps.
NOT_OURS = {"auth", "django_celery_beat"}
APPS = ("tuneplane", "audit", "fleets", "nodes", "placement")


def _ours(model_admin_class, method: str) -> bool:
    """Whether ``method`` is overridden by one of our admin classes, not Django's default."""
    for klass in model_admin_class.__mro__:
        if method in vars(klass):
            return klass.__module__.split(".")[0] in APPS
    return False


def writing_admins():
    for model, model_admin in admin.site._registry.items():
        if model._meta.app_label in NOT_OURS:
            continue
        yield model, model_admin


@pytest.fixture
def staff_request(admin_user):
    request = RequestFactory().get("/admin/")
    request.user = admin_user
    return request


def test_A1_every_admin_that_writes_does_so_through_our_own_save_and_delete(staff_request):
    unaudited = []
    for model, model_admin in writing_admins():
        name, klass = model._meta.label, type(model_admin)
        if (
            model_admin.has_add_permission(staff_request)
            or model_admin.has_change_permission(staff_request)
        ) and not _ours(klass, "save_model"):
            unaudited.append(f"{name}: saves with Django's save_model")
        if model_admin.has_delete_permission(staff_request):
            if not _ours(klass, "delete_model"):
                unaudited.append(f"{name}: deletes with Django's delete_model")
            if "delete_selected" in model_admin.get_actions(staff_request) and not _ours(
                klass, "delete_queryset"
            ):
                unaudited.append(f"{name}: bulk-deletes with Django's delete_queryset")
        for inline in model_admin.get_inline_instances(staff_request):
            writes = (
                inline.has_add_permission(staff_request, None)
                or inline.has_change_permission(staff_request)
                or inline.has_delete_permission(staff_request)
            )
            if writes and not _ours(klass, "save_formset"):
                unaudited.append(
                    f"{name}: its {type(inline).__name__} saves with Django's save_formset"
                )
    assert not unaudited, "admin writes that skip the services: " + "; ".join(unaudited)


def test_A1_the_check_finds_an_admin_that_saves_with_djangos_default():
    """The check above can fail: an admin like ours but saving as Django does is caught."""

    class Careless(ModelAdmin):
        pass

    class CarelessInline(InlineModelAdmin):
        pass

    assert not _ours(Careless, "save_model") and not _ours(CarelessInline, "save_formset")
    assert _ours(type(admin.site._registry[Project]), "save_formset")
    assert _ours(type(admin.site._registry[HardwareSeries]), "save_model")


@pytest.fixture
def staff(client, admin_user):
    client.force_login(admin_user)
    return client


def events(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action))


def test_A1_a_member_added_and_removed_in_the_admin_is_audited(staff, project, outsider):
    url = f"/admin/tuneplane/project/{project.pk}/change/"
    form = {
        "name": project.name,
        "max_priority": "0",
        "memberships-TOTAL_FORMS": "1",
        "memberships-INITIAL_FORMS": "0",
        "memberships-MIN_NUM_FORMS": "0",
        "memberships-MAX_NUM_FORMS": "1000",
        "memberships-0-user": outsider.pk,
        "memberships-0-project": project.pk,
    }
    assert staff.post(url, form).status_code == 302
    membership = Membership.objects.get(project=project, user=outsider)
    (added,) = events("membership.added")
    assert (added.actor_label, added.target_id, added.after) == (
        "ops",
        str(membership.pk),
        {"project": "ml", "user": "otto"},
    )

    form.update(
        {
            "memberships-INITIAL_FORMS": "1",
            "memberships-0-id": membership.pk,
            "memberships-0-DELETE": "on",
        }
    )
    assert staff.post(url, form).status_code == 302
    assert not Membership.objects.filter(project=project, user=outsider).exists()
    (removed,) = events("membership.removed")
    assert removed.before == {"project": "ml", "user": "otto"}


def test_A1_a_project_made_in_the_admin_with_a_member_is_audited(staff, outsider):
    form = {
        "slug": "vision",
        "name": "Vision",
        "max_priority": "0",
        "memberships-TOTAL_FORMS": "1",
        "memberships-INITIAL_FORMS": "0",
        "memberships-MIN_NUM_FORMS": "0",
        "memberships-MAX_NUM_FORMS": "1000",
        "memberships-0-user": outsider.pk,
    }
    assert staff.post("/admin/tuneplane/project/add/", form).status_code == 302
    project = Project.objects.get(slug="vision")
    assert Membership.objects.filter(project=project, user=outsider).exists()
    assert [e.action for e in AuditEvent.objects.order_by("id")] == [
        "project.created",
        "membership.added",
    ]


def test_A1_a_hardware_series_added_and_renamed_in_the_admin_is_audited(staff):
    form = {"slug": "ascend-910c", "name": "Huawei Ascend 910C", "vendor": "huawei"}
    assert staff.post("/admin/nodes/hardwareseries/add/", form).status_code == 302
    series = HardwareSeries.objects.get(slug="ascend-910c")
    (created,) = events("hardware_series.created")
    assert (created.target_id, created.after["name"]) == (str(series.pk), "Huawei Ascend 910C")

    form["name"] = "Ascend 910C"
    assert staff.post(f"/admin/nodes/hardwareseries/{series.pk}/change/", form).status_code == 302
    (updated,) = events("hardware_series.updated")
    assert (updated.before, updated.after) == (
        {"name": "Huawei Ascend 910C", "vendor": "huawei"},
        {"name": "Ascend 910C", "vendor": "huawei"},
    )


def test_A1_a_card_name_added_by_hand_in_the_admin_is_audited_and_mapped(staff):
    h100 = HardwareSeries.objects.get(slug="h100")
    form = {"name": "NVIDIA H100 NVL 94GB", "series": h100.pk}
    assert staff.post("/admin/nodes/cardalias/add/", form).status_code == 302
    alias = CardAlias.objects.get(name="NVIDIA H100 NVL 94GB")
    assert alias.series == h100
    assert [e.action for e in AuditEvent.objects.order_by("id")] == [
        "card_alias.added",
        "card_alias.mapped",
    ]

    unmapped = CardAlias.objects.create(name="Mystery X9")
    assert (
        staff.post(f"/admin/nodes/cardalias/{unmapped.pk}/delete/", {"post": "yes"}).status_code
        == 302
    )
    (deleted,) = events("card_alias.deleted")
    assert deleted.before == {"name": "Mystery X9", "series": None}
