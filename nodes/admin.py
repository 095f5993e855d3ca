from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import Exists, OuterRef
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from audit.services import Actor
from fleets.admin import register_fleet_action
from fleets.choices import FleetKind
from fleets.selectors import fleet_get_visible
from tuneplane.admin import ReadOnlyAdmin
from tuneplane.errors import ApplicationError

from . import admin_hardware  # noqa: F401  (registers the hardware registry's pages)
from .choices import CordonSource, SchedulingState
from .health_shown import tripped_breakers
from .models import (
    ControlSession,
    JoinToken,
    Node,
    NodeCommand,
    StrayCommand,
)
from .node_page import VERBS, node_page
from .selectors import addresses_shared, commands_active_on, live_sessions_of
from .services import cordons, drains, health, join, removal

# What the admin's actions on nodes call: the same services as the API's verbs.
NODE_VERBS = {
    "cordon": cordons.node_cordon,
    "uncordon": cordons.node_uncordon,
    "drain": drains.node_drain,
    "resume": drains.node_resume,
    "remove": removal.node_remove,
}


@admin.register(JoinToken)
class JoinTokenAdmin(ReadOnlyAdmin):
    """Tokens are minted from a Fleet's page (Add a machine) and shown once, there."""

    list_display = [
        "prefix",
        "fleet",
        "created_by",
        "created_at",
        "expires_at",
        "used_at",
        "node",
        "revoked_at",
    ]
    list_filter = ["fleet", "used_at", "revoked_at"]
    list_select_related = ["fleet", "created_by", "node"]
    exclude = ["digest"]
    actions = ["revoke"]

    def get_urls(self):
        return [
            path(
                "add-machine/<str:fleet_id>/",
                self.admin_site.admin_view(self.add_machine),
                name="nodes_jointoken_add_machine",
            )
        ] + super().get_urls()

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):
        for token in queryset:
            join.join_token_revoke(actor=Actor.of_user(request.user), token=token)
        self.message_user(
            request,
            "Revoked. A used token stays as it was: its node keeps its identity.",
            messages.SUCCESS,
        )

    def add_machine(self, request, fleet_id: str):
        """GET: what will happen. POST: mint, and show the token this once (J2)."""
        try:
            fleet = fleet_get_visible(request.user, fleet_id)
        except ApplicationError:
            raise Http404(fleet_id) from None
        context = {
            **self.admin_site.each_context(request),
            "fleet": fleet,
            "title": f"Add a machine to {fleet.id}",
            "opts": self.model._meta,
            "is_node_fleet": fleet.kind == FleetKind.NODE,
            "fleet_url": reverse("admin:fleets_fleet_change", args=[fleet.pk]),
        }
        if request.method == "POST" and context["is_node_fleet"]:
            token, secret = join.join_token_mint(actor=Actor.of_user(request.user), fleet=fleet)
            context.update(token=token, minted=join.join_commands(fleet.id, secret))
        response = TemplateResponse(request, "admin/nodes/add_machine.html", context)
        response["Cache-Control"] = "no-store"
        return response


class ConnectionFilter(admin.SimpleListFilter):
    title = "control connection"
    parameter_name = "connection"

    def lookups(self, request, model_admin):
        return [("connected", "connected"), ("disconnected", "disconnected")]

    def queryset(self, request, queryset):
        live = Exists(
            ControlSession.objects.filter(
                node=OuterRef("pk"), closed_at__isnull=True, lease_expires_at__gt=timezone.now()
            )
        )
        if self.value() == "connected":
            return queryset.filter(live)
        if self.value() == "disconnected":
            return queryset.filter(~live)
        return queryset


class CordonFilter(admin.SimpleListFilter):
    title = "cordon"
    parameter_name = "cordon"

    def lookups(self, request, model_admin):
        return [*CordonSource.choices, ("none", "not cordoned")]

    def queryset(self, request, queryset):
        if self.value() == "none":
            return queryset.filter(cordons__isnull=True)
        if self.value() in CordonSource.values:
            return queryset.filter(cordons__source=self.value())
        return queryset


class CordonForm(forms.Form):
    reason = forms.CharField(
        max_length=200,
        help_text="Required: say why, as in Slurm's Reason=. Shown on the Fleet page.",
    )


class DrainForm(CordonForm):
    deadline = forms.DateTimeField(
        required=False,
        help_text="Optional, YYYY-MM-DD HH:MM (server time): when the machines should be idle. "
        "Nothing is stopped at it (D1); past it the drain shows overdue.",
    )


def _with_reason(admin_view, request, queryset, verb: str, form_class, title: str, apply):
    """An action that needs a reason: a confirmation page with the form, then ``apply``."""
    form = form_class(request.POST if "apply" in request.POST else None)
    if form.is_valid():
        apply(form.cleaned_data)
        return None
    meta = admin_view.model._meta
    return TemplateResponse(
        request,
        "admin/nodes/node_action.html",
        {
            **admin_view.admin_site.each_context(request),
            "title": title,
            "action": verb,
            "nodes": queryset,
            "form": form,
            "opts": meta,
            "cancel_url": getattr(request, "node_page_url", None)
            or reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist"),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        },
    )


@admin.action(description="Drain the machines of selected Fleets (one reason for all)")
def drain_machines(fleet_admin, request, queryset):
    """Every machine of each node Fleet drained in one step (D1), through the API's service."""

    def apply(data):
        for fleet in queryset:
            try:
                nodes = drains.fleet_nodes_drain(
                    actor=Actor.of_user(request.user), fleet=fleet, **data
                )
            except ApplicationError as error:
                fleet_admin.message_user(request, f"{fleet.id}: {error.message}", messages.ERROR)
            else:
                fleet_admin.message_user(
                    request,
                    f"{fleet.id}: {len(nodes)} machine(s) draining or drained. Nothing that "
                    "runs was stopped.",
                    messages.SUCCESS,
                )

    return _with_reason(
        fleet_admin, request, queryset, "drain_machines", DrainForm, "Drain machines", apply
    )


register_fleet_action(drain_machines)


@admin.action(description="Reset the health breaker of selected Fleets (H7)")
def reset_health_breaker(fleet_admin, request, queryset):
    """Automatic quarantine runs again on each selected Fleet, audited (health_breaker_reset)."""
    for fleet in queryset:
        try:
            health.health_breaker_reset(fleet_id=fleet.pk, actor=Actor.of_user(request.user))
        except ApplicationError as error:
            fleet_admin.message_user(request, f"{fleet.id}: {error.message}", messages.ERROR)
        else:
            fleet_admin.message_user(
                request, f"{fleet.id}: health breaker reset.", messages.SUCCESS
            )


register_fleet_action(reset_health_breaker)


def _breaker_banner(request, fleet_ids=None) -> None:
    """H7: a banner for each tripped health breaker (of these Fleets)."""
    for breaker in tripped_breakers(fleet_ids):
        messages.error(
            request,
            f"Health breaker tripped on Fleet {breaker.fleet_id} "
            f"({breaker.tripped_at:%Y-%m-%d %H:%M:%S}): {breaker.tripped_reason}. Automatic "
            "quarantine is stopped there; new card faults are recorded only. Reset it from "
            "the Fleets list.",
        )


@admin.action(description="Return the selected nodes' quarantined cards to service (H6)")
def return_quarantined_cards(node_admin, request, queryset):
    """Every quarantined card of each selected node returned, each audited (card_return)."""
    returned = []
    for node in queryset:
        for uuid, card in sorted(node.unhealthy_cards.items(), key=lambda c: c[1]["index"]):
            try:
                health.card_return(node_id=node.pk, uuid=uuid, actor=Actor.of_user(request.user))
            except ApplicationError as error:
                node_admin.message_user(request, f"{node.id}: {error.message}", messages.ERROR)
            else:
                returned.append(f"{node.hostname or node.id} card {card['index']}")
    node_admin.message_user(
        request,
        f"Returned to service: {', '.join(returned)}." if returned else "No card was quarantined.",
        messages.SUCCESS if returned else messages.WARNING,
    )


@admin.register(Node)
class NodeAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "hostname",
        "fleet_of",
        "address_flagged",
        "connection",
        "scheduling",
        "cards",
        "liveness",
        "inventory_observed_at",
    ]
    list_filter = [
        ConnectionFilter,
        "scheduling_state",
        CordonFilter,
        "quiet_train",
        "quiet_serve",
        "quiet_env",
        "fleet",
    ]
    search_fields = ["id", "hostname", "address"]
    list_select_related = ["fleet"]
    actions = [*VERBS, return_quarantined_cards]
    # The page reads as an operator asks (issue 49): the machine, its connection and liveness
    # in words, the record; its cards, cordons, drain and what runs there are tables above
    # (templates/admin/nodes/node/change_form.html), so no raw JSON and no False flag shown
    # as a red cross.
    fieldsets = [
        (None, {"fields": ["id", "hostname", "fleet_of", "address_flagged", "agent_version"]}),
        (
            "Connection and liveness",
            {"fields": ["connection", "liveness_shown", "last_seen_at", "inventory_observed_at"]},
        ),
        ("Machine", {"fields": ["driver", "container_runtime", "storage_root"]}),
        ("Record", {"fields": ["fingerprint", "created_at", "removed_at", "strays_dropped"]}),
    ]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("cordons")

    def get_changelist_instance(self, request):
        changelist = super().get_changelist_instance(request)
        self._shared = addresses_shared(changelist.result_list)
        self._sessions = live_sessions_of(changelist.result_list)
        return changelist

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # removal goes through D2-D4, never a delete
        return actions

    def get_urls(self):
        verb = path(
            "<path:object_id>/verb/<str:verb>/",
            self.admin_site.admin_view(self.node_verb),
            name="nodes_node_verb",
        )
        return [verb, *super().get_urls()]

    def node_verb(self, request, object_id: str, verb: str):
        """A verb's button on a node's page: the node list's action of that name on this one
        node (its reason asked for, the same service, the same audit), then back to the page."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        node = self.get_object(request, object_id)
        if node is None or verb not in VERBS:
            raise Http404(object_id)
        request.node_page_url = reverse("admin:nodes_node_change", args=[node.pk])
        response = getattr(self, verb)(request, self.get_queryset(request).filter(pk=node.pk))
        return response or HttpResponseRedirect(request.node_page_url)

    @admin.display(description="fleet", ordering="fleet")
    def fleet_of(self, node: Node) -> str:
        """A removed node kept after its Fleet was deleted names the Fleet it was in (F7)."""
        return node.fleet_id or f"{node.former_fleet} (deleted)"

    @admin.display(description="address")
    def address_flagged(self, node: Node):
        if node.address in getattr(self, "_shared", set()):
            return format_html(
                '{} <strong title="{}">⚠ shared</strong>',
                node.address,
                "Another live node answers at this address: a re-join may have "
                "left an old record, and its cards are counted twice.",
            )
        return node.address

    @admin.display(description="connection")
    def connection(self, node: Node):
        session = getattr(self, "_sessions", {}).get(node.id)
        if session is None:
            ended = node.last_session_close_reason
            return format_html(
                "disconnected <small>({}{})</small>",
                f"last heard {node.last_seen_at:%Y-%m-%d %H:%M:%S}"
                if node.last_seen_at
                else "never connected",
                f"; {ended}" if ended else "",
            )
        return format_html('<strong title="{}">connected</strong>', session.gateway)

    @admin.display(description="scheduling")
    def scheduling(self, node: Node):
        cordons = list(node.cordons.all())
        why = [f"{c.source}: {c.reason}" for c in cordons]
        if node.drain_started_at is not None:
            why.append(
                f"drain: {node.drain_reason} ({node.drain_by}"
                + (", overdue" if node.drain_overdue_at else "")
                + ")"
            )
        if not why:
            return node.scheduling_state
        return format_html("{} <small>({})</small>", node.scheduling_shown(cordons), "; ".join(why))

    @admin.display(description="cards")
    def cards(self, node: Node) -> str:
        return (
            ", ".join(f"{c['count']} × {c['name']}" for c in node.inventory.get("cards", [])) or "—"
        )

    @admin.display(description="liveness")
    def liveness(self, node: Node) -> str:
        return " ".join(f"{c}:{state}" for c, state in node.liveness().items())

    @admin.display(description="liveness per capability")
    def liveness_shown(self, node: Node) -> str:
        """Quiet is said in words, per capability its Fleet declares (L2-L4): a node that is
        fine reads "ok", never a False flag's red cross."""
        return ", ".join(f"{c}: {state}" for c, state in node.liveness().items()) or "—"

    @admin.display(description="driver")
    def driver(self, node: Node) -> str:
        return node.inventory.get("driver") or "—"

    @admin.display(description="container runtime")
    def container_runtime(self, node: Node) -> str:
        return node.inventory.get("container_runtime") or "—"

    @admin.display(description="storage root")
    def storage_root(self, node: Node) -> str:
        visible = node.inventory.get("storage_root_visible")
        if visible is None:
            return "not reported"
        return "visible" if visible else "not visible: the node is cordoned for storage (L6)"

    def changelist_view(self, request, extra_context=None):
        _breaker_banner(request)
        return super().changelist_view(request, extra_context)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        node = self.get_object(request, object_id)
        extra_context = dict(extra_context or {})
        if node is not None:
            if node.fleet_id:
                _breaker_banner(request, [node.fleet_id])
            self._shared = addresses_shared([node])
            self._sessions = live_sessions_of([node])
            extra_context["node_page"] = node_page(node)
        return super().change_view(request, object_id, form_url, extra_context)

    def _each(self, request, queryset, verb: str, **kwargs) -> None:
        done = []
        for node in queryset:
            try:
                NODE_VERBS[verb](actor=Actor.of_user(request.user), node=node, **kwargs)
            except ApplicationError as error:
                self.message_user(request, f"{node.id}: {error.message}", messages.ERROR)
            else:
                done.append(node.hostname or node.id)
        if done:
            self.message_user(
                request,
                f"{verb.capitalize()}: {', '.join(done)}. Nothing that runs was stopped.",
                messages.SUCCESS,
            )

    def _confirm(self, request, queryset, action: str, title: str, **context):
        context.setdefault(
            "cancel_url",
            getattr(request, "node_page_url", None) or reverse("admin:nodes_node_changelist"),
        )
        return TemplateResponse(
            request,
            "admin/nodes/node_action.html",
            {
                **self.admin_site.each_context(request),
                "title": title,
                "action": action,
                "nodes": queryset,
                "opts": self.model._meta,
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
                **context,
            },
        )

    @admin.action(description="Cordon selected nodes (no new work; a reason is required)")
    def cordon(self, request, queryset):
        return _with_reason(
            self,
            request,
            queryset,
            "cordon",
            CordonForm,
            "Cordon nodes",
            lambda data: self._each(request, queryset, "cordon", **data),
        )

    @admin.action(description="Uncordon selected nodes (the operator's cordon only)")
    def uncordon(self, request, queryset):
        self._each(request, queryset, "uncordon")

    @admin.action(description="Drain selected nodes (leaving; running work finishes; a reason)")
    def drain(self, request, queryset):
        return _with_reason(
            self,
            request,
            queryset,
            "drain",
            DrainForm,
            "Drain nodes",
            lambda data: self._each(request, queryset, "drain", **data),
        )

    @admin.action(description="Resume selected nodes (a drain undone: they take work again)")
    def resume(self, request, queryset):
        self._each(request, queryset, "resume")

    @admin.action(description="Remove selected nodes (drained; gone ones with force)")
    def remove(self, request, queryset):
        if "apply" in request.POST:
            self._each(request, queryset, "remove", force=request.POST.get("force") == "on")
            return None
        left_behind = {node.id: commands_active_on(node) for node in queryset}
        return self._confirm(
            request,
            queryset,
            "remove",
            "Remove nodes",
            rows=[(node, left_behind[node.id]) for node in queryset],
            any_gone=any(n.scheduling_state == SchedulingState.GONE for n in queryset),
        )


@admin.register(NodeCommand)
class NodeCommandAdmin(ReadOnlyAdmin):
    """Commands are sent through the API; their state is what the nodes report (L5)."""

    list_display = [
        "id",
        "node",
        "kind",
        "state",
        "exit_code",
        "created_by",
        "created_at",
        "updated_at",
    ]
    list_filter = ["state", "kind", "node__fleet"]
    search_fields = ["id", "node__id", "node__hostname"]
    list_select_related = ["node"]
    exclude = ["payload"]  # a member's carries its job's env values: shown nowhere again


@admin.register(StrayCommand)
class StrayCommandAdmin(ReadOnlyAdmin):
    """Commands a node reports that the console never gave it: flagged, never killed (L5)."""

    list_display = [
        "command_id",
        "node",
        "state",
        "exit_code",
        "first_reported_at",
        "last_reported_at",
    ]
    list_filter = ["state", "node__fleet"]
    search_fields = ["command_id", "node__id", "node__hostname"]
    list_select_related = ["node"]
