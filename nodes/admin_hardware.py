"""The hardware registry in the admin: series, and card names mapped to them (J4)."""

from django.contrib import admin

from audit.services import Actor
from tuneplane.admin import StaffAdmin

from .models import CardAlias, HardwareSeries
from .services import hardware


@admin.register(HardwareSeries)
class HardwareSeriesAdmin(StaffAdmin):
    list_display = ["slug", "name", "vendor"]
    search_fields = ["slug", "name"]

    def get_readonly_fields(self, request, obj=None):
        # Jobs pin a slug and nodes' card summaries are kept under it: fixed once created.
        return ["slug"] if obj is not None else []

    def save_model(self, request, obj, form, change):
        actor, data = Actor.of_user(request.user), form.cleaned_data
        if change:
            hardware.series_update(
                actor=actor, series=obj, name=data["name"], vendor=data["vendor"]
            )
        else:
            obj.pk = hardware.series_create(
                actor=actor, slug=data["slug"], name=data["name"], vendor=data["vendor"]
            ).pk

    def delete_model(self, request, obj):
        hardware.series_delete(actor=Actor.of_user(request.user), series=obj)

    def delete_queryset(self, request, queryset):
        self.delete_each(request, queryset)


class MappedFilter(admin.SimpleListFilter):
    title = "mapping"
    parameter_name = "mapped"

    def lookups(self, request, model_admin):
        return [("no", "unmapped"), ("yes", "mapped")]

    def queryset(self, request, queryset):
        if self.value() in ("yes", "no"):
            return queryset.filter(series__isnull=self.value() == "no")
        return queryset


@admin.register(CardAlias)
class CardAliasAdmin(StaffAdmin):
    """Card names as machines report them. Unmapped ones are mapped here, in the list (J4)."""

    list_display = ["name", "series", "first_seen_at"]
    list_editable = ["series"]
    list_filter = [MappedFilter, "series"]
    search_fields = ["name"]
    list_select_related = ["series"]

    def get_readonly_fields(self, request, obj=None):
        # Nodes' card summaries follow a mapping by this name: it is what machines report.
        return ["name", "first_seen_at"] if obj is not None else ["first_seen_at"]

    def has_delete_permission(self, request, obj=None):
        # Unmapping goes through the mapping (series empty), so that nodes follow it.
        return super().has_delete_permission(request, obj) and (
            obj is None or obj.series_id is None
        )

    def save_model(self, request, obj, form, change):
        actor = Actor.of_user(request.user)
        if not change:  # a name added by hand: recorded unmapped, then mapped as any other
            obj.pk = hardware.card_alias_add(actor=actor, name=obj.name, series=obj.series).pk
        elif "series" in form.changed_data:
            hardware.card_alias_map(actor=actor, alias=obj, series=obj.series)

    def delete_model(self, request, obj):
        hardware.card_alias_delete(actor=Actor.of_user(request.user), alias=obj)

    def delete_queryset(self, request, queryset):
        self.delete_each(request, queryset)
