from django.contrib import admin, messages
from django.http import Http404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from audit.services import Actor
from fleets.choices import FleetKind
from fleets.selectors import fleet_get_visible
from tuneplane.admin import ReadOnlyAdmin, StaffAdmin
from tuneplane.errors import ApplicationError

from . import services
from .models import CardAlias, HardwareSeries, JoinToken, Node
from .selectors import addresses_shared


@admin.register(JoinToken)
class JoinTokenAdmin(ReadOnlyAdmin):
    """Tokens are minted from a Fleet's page (Add a machine) and shown once, there."""

    list_display = ["prefix", "fleet", "created_by", "created_at", "expires_at", "used_at",
                    "node", "revoked_at"]
    list_filter = ["fleet", "used_at", "revoked_at"]
    list_select_related = ["fleet", "created_by", "node"]
    exclude = ["digest"]
    actions = ["revoke"]

    def get_urls(self):
        return [path("add-machine/<str:fleet_id>/", self.admin_site.admin_view(self.add_machine),
                     name="nodes_jointoken_add_machine")] + super().get_urls()

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):
        for token in queryset:
            services.join_token_revoke(actor=Actor.of_user(request.user), token=token)
        self.message_user(request, "Revoked. A used token stays as it was: its node keeps "
                          "its identity.", messages.SUCCESS)

    def add_machine(self, request, fleet_id: str):
        """GET: what will happen. POST: mint, and show the token this once (J2)."""
        try:
            fleet = fleet_get_visible(request.user, fleet_id)
        except ApplicationError:
            raise Http404(fleet_id) from None
        context = {**self.admin_site.each_context(request), "fleet": fleet,
                   "title": f"Add a machine to {fleet.id}", "opts": self.model._meta,
                   "is_node_fleet": fleet.kind == FleetKind.NODE,
                   "fleet_url": reverse("admin:fleets_fleet_change", args=[fleet.pk])}
        if request.method == "POST" and context["is_node_fleet"]:
            token, secret = services.join_token_mint(actor=request.user, fleet=fleet)
            context.update(token=token, minted=services.join_commands(fleet.id, secret))
        response = TemplateResponse(request, "admin/nodes/add_machine.html", context)
        response["Cache-Control"] = "no-store"
        return response


@admin.register(Node)
class NodeAdmin(ReadOnlyAdmin):
    list_display = ["id", "hostname", "fleet", "address_flagged", "scheduling_state", "cards",
                    "inventory_observed_at", "created_at"]
    list_filter = ["fleet", "scheduling_state"]
    search_fields = ["id", "hostname", "address"]
    list_select_related = ["fleet"]

    def get_changelist_instance(self, request):
        changelist = super().get_changelist_instance(request)
        self._shared = addresses_shared(changelist.result_list)
        return changelist

    @admin.display(description="address")
    def address_flagged(self, node: Node):
        if node.address in getattr(self, "_shared", set()):
            return format_html('{} <strong title="{}">⚠ shared</strong>', node.address,
                               "Another live node answers at this address: a re-join may have "
                               "left an old record, and its cards are counted twice.")
        return node.address

    @admin.display(description="cards")
    def cards(self, node: Node) -> str:
        return ", ".join(f"{c['count']} × {c['name']}" for c in node.inventory.get("cards", [])) \
            or "—"


@admin.register(HardwareSeries)
class HardwareSeriesAdmin(StaffAdmin):
    list_display = ["slug", "name", "vendor"]
    search_fields = ["slug", "name"]


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

    def save_model(self, request, obj, form, change):
        if change and "series" in form.changed_data:
            services.card_alias_map(actor=Actor.of_user(request.user), alias=obj,
                                    series=obj.series)
        else:
            super().save_model(request, obj, form, change)
