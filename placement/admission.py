"""Admission: which Fleet takes a workload, or exactly why none can (P1–P7, F3, F8, L1).

Every gate judges a Fleet against the workload's project, never against the submitter (F8):
a project Fleet takes only its own project's workloads, so a member of two projects, or
staff, cannot put one project's workload (and so its members' eyes) on another's Fleet.

The gates, in order: the named Fleet is open to the workload's project (404, the same
answer as a Fleet that does not exist), it has the capability, it is active, the inventory
fits. Automatic choice runs the same gates over every Fleet open to the project and never
counts, names or hints at another. Inventory fit is a check, not a reservation (P7), and it
counts what the allocator can hold: a node's devices, each card by index and UUID. A node
whose inventory counts cards but lists no devices holds nothing here, and a refusal it caused
says so, with the fix (Q9).

The fit counts every node that is coming back — cordoned, quiet or gone — and none that is
leaving — draining, drained or removed (P8): work that only a cordoned machine fits is
admitted and queues, its reason to wait ``cordoned`` with the cordon's words (Q8); work that
only a leaving machine fits is refused, naming it. Placing is the allocator's, on the nodes
placeable now (L1). Among several Fleets that fit, one that fits on its placeable nodes now
is chosen first.

Queries do not depend on the number of nodes or Fleets: the visible Fleets, one aggregate
per Fleet over the counted nodes' rows, then where it fits in the Fleet chosen.
"""

from dataclasses import dataclass, field

from django.core.exceptions import EmptyResultSet
from django.db import connection
from django.db.models import (
    BooleanField,
    Case,
    ExpressionWrapper,
    F,
    IntegerField,
    Q,
    Value,
    When,
)
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Cast, Coalesce
from django.utils import timezone

from fleets.choices import FleetKind, FleetState
from fleets.selectors import fleet_get_open_to, fleets_open_to
from nodes.choices import SchedulingState
from nodes.models import Node
from nodes.selectors import (
    card_series,
    cards_summary,
    cluster_machines_placeable,
    nodes_coming_back,
    placeable_now,
    with_container_runtime,
)
from tuneplane.errors import PlacementRefused

from .choices import Refusal
from .metrics import measured_admission
from .models import Quota
from .sharing import Book, QuotaRow

GATES = ["visibility", "capability", "state", "inventory_fit"]
# Leaving nodes a refusal names; past this many it says how many more.
LEAVING_NAMED = 5
DRAINING = (SchedulingState.DRAINING, SchedulingState.DRAINED)


@dataclass(frozen=True)
class Need:
    """What a workload asks of a Fleet."""

    capability: str
    series: str = ""
    cards: int = 0  # per node; 0 asks for no cards, and skips the fit gate (without an image)
    nodes: int = 1
    kinds: tuple[str, ...] = ()  # the backends allowed; empty: any
    # It names an image: only node Fleets' nodes with a container runtime fit (DESIGN §7).
    container: bool = False

    def describe(self) -> str:
        cards = f"{self.cards} × {self.series or 'any card'}"
        return cards + (f" on each of {self.nodes} nodes" if self.nodes > 1 else " on one node")

    @property
    def checks_fit(self) -> bool:
        return self.cards > 0 or self.container


@dataclass
class FleetFit:
    """How a Fleet's nodes that are not leaving hold a need (P8): a check, not a reservation
    (P7)."""

    fleet_id: str
    largest: int = 0  # the most matching cards on one counted node
    fitting_count: int = 0  # counted nodes holding the cards asked per node
    fitting_cards: int = 0  # the matching cards on those nodes
    # Counted nodes that would hold the cards asked by their cards count, but list no
    # devices for the allocator to hold (Q9): never counted above; and the most cards one
    # of them counts.
    unlisted: int = 0
    unlisted_cards: int = 0
    fitting_now: int = 0  # of the fitting nodes, those placeable now (L1)

    def fits(self, need: "Need") -> bool:
        return self.fitting_count >= need.nodes

    def fits_now(self, need: "Need") -> bool:
        return self.fitting_now >= need.nodes


@dataclass
class Admitted:
    fleet_id: str
    gates: list[str]
    nodes: list[str] = field(default_factory=list)  # where it fits, best first

    def as_record(self) -> dict:
        return {"fleet": self.fleet_id, "gates": self.gates, "fits_on": self.nodes[:8]}


class Holdings:
    """The machines of some Fleets that are not leaving (P8) against one need, at one moment.
    A node holds what its row keeps (J4) if its inventory lists its devices (Q9), so nothing
    is unpacked or joined per node; a cluster Fleet's machines are those of a fresh snapshot
    from its manager (L1), mapped the same way."""

    def __init__(self, fleets: list, need: Need, now=None):  # Fleets, or rows: id and kind
        self.fleets, self.need, self.now = fleets, need, now or timezone.now()
        self.node_fleets = [f.id for f in fleets if f.kind == FleetKind.NODE]
        nodes = nodes_coming_back(self.node_fleets)
        if need.container:
            nodes = with_container_runtime(nodes)
        counted = _cards_counted(need)
        self.nodes = nodes.annotate(
            counted=counted,
            listed=ExpressionWrapper(DEVICES_LISTED, output_field=BooleanField()),
            held=Case(When(DEVICES_LISTED, then=counted), default=Value(0)),
            now=ExpressionWrapper(placeable_now(self.now), output_field=BooleanField()),
        )
        # A cluster's manager runs its own way: its machines never fit a workload's image.
        clusters = [f.id for f in fleets if f.kind != FleetKind.NODE]
        self.clusters = [] if need.container else clusters
        self._machines: dict[str, list[tuple[int, str]]] | None = None

    def per_fleet(self) -> dict[str, FleetFit]:
        """One aggregate statement for node Fleets, whatever the number of nodes and Fleets;
        two queries more when cluster Fleets are among them."""
        fits = {fleet.id: FleetFit(fleet.id) for fleet in self.fleets}
        for fleet_id, held in self.cluster_machines().items():
            fitting = [cards for cards, _ in held if cards >= self.need.cards]
            fits[fleet_id] = FleetFit(
                fleet_id,
                max((c for c, _ in held), default=0),
                len(fitting),
                sum(fitting),
                fitting_now=len(fitting),
            )
        try:
            inner, params = (
                self.nodes.order_by()
                .values("fleet_id", "counted", "listed", "now")
                .query.sql_with_params()
            )
        except EmptyResultSet:
            return fits
        with connection.cursor() as cursor:
            cursor.execute(FIT_SQL.format(counted=inner), [*params, *[self.need.cards] * 7])
            for fleet_id, largest, count, cards, *unlisted, now in cursor.fetchall():
                fits[fleet_id] = FleetFit(fleet_id, largest, count, cards or 0, *unlisted, now)
        return fits

    def without_devices(self, fits: dict[str, FleetFit]) -> str:
        """Why nothing fits, when nodes that count cards but list no devices are why (Q9):
        how many in each Fleet they would have made fit, with the fix; else nothing. Never
        which nodes: their ids are an administrator's to read (the join warned the node)."""
        what = self.need.series or "cards"
        named = [
            (
                f"a node of {fit.fleet_id} reports {fit.unlisted_cards} {what}"
                if fit.unlisted == 1
                else f"{fit.unlisted} nodes of {fit.fleet_id} report up to "
                f"{fit.unlisted_cards} {what}"
            )
            + " but no devices"
            for fit in sorted(fits.values(), key=lambda fit: fit.fleet_id)
            if fit.unlisted and fit.fitting_count + fit.unlisted >= self.need.nodes
        ]
        if not named:
            return ""
        said = "; ".join(named)
        return (
            f" {said[0].upper()}{said[1:]}: the agent's inventory must list each card's index "
            'and uuid ("devices", as tuneplane-node reports them from nvidia-smi), or its node '
            "counts toward no fit (rule Q9)."
        )

    def leaving(self, fits: dict[str, FleetFit]) -> str:
        """Why nothing fits, when leaving machines are why: the nodes of these Fleets that
        would hold the need but are draining or drained, each with its drain's reason, where
        they would have made it fit (P8, D1: resume brings one back); else nothing. Only
        Fleets the project can see are ever among ``self.fleets`` (F8). One query, on the
        refusal's path only."""
        if not self.node_fleets:
            return ""
        nodes = (
            Node.objects.filter(fleet_id__in=self.node_fleets)
            .filter(Q(scheduling_state__in=DRAINING) | Q(drain_started_at__isnull=False))
            .exclude(scheduling_state=SchedulingState.REMOVED)
        )
        if self.need.container:
            nodes = with_container_runtime(nodes)
        held = Case(When(DEVICES_LISTED, then=_cards_counted(self.need)), default=Value(0))
        would_fit = list(
            nodes.annotate(held=held)
            .filter(held__gte=self.need.cards)
            .order_by("fleet_id", "id")
            .only("id", "fleet_id", "scheduling_state", "drain_reason")
        )
        per_fleet: dict[str, int] = {}
        for node in would_fit:
            per_fleet[node.fleet_id] = per_fleet.get(node.fleet_id, 0) + 1
        named = [
            node
            for node in would_fit
            if fits[node.fleet_id].fitting_count + per_fleet[node.fleet_id] >= self.need.nodes
        ]
        if not named:
            return ""
        listed = ", ".join(
            f"{node.id} ({node.scheduling_state}: {node.drain_reason})"
            for node in named[:LEAVING_NAMED]
        )
        more = f" and {len(named) - LEAVING_NAMED} more" if len(named) > LEAVING_NAMED else ""
        nodes_fit = "node that would fit is" if len(named) == 1 else "nodes that would fit are"
        return (
            f" {len(named)} {nodes_fit} leaving: {listed}{more}. A draining or drained "
            "machine takes no new work until an administrator resumes it (rules D1, P8)."
        )

    def fitting_nodes(self, fleet_id: str, limit: int = 8) -> list[str]:
        """Where the need fits in one Fleet, most cards first: what the admission records."""
        if fleet_id in self.clusters:
            held = sorted(self.cluster_machines().get(fleet_id, []), key=lambda m: (-m[0], m[1]))
            return [name for cards, name in held if cards >= self.need.cards][:limit]
        return list(
            self.nodes.filter(fleet_id=fleet_id, held__gte=self.need.cards)
            .order_by("-now", "-held", "id")
            .values_list("id", flat=True)[:limit]
        )

    def _held(self, summary: dict) -> int:
        """What one machine's card summary holds of the need, as _cards_counted reads a node's."""
        if not self.need.series:
            return summary["card_count"]
        return summary["series_cards"].get(self.need.series, 0)

    def cluster_machines(self) -> dict[str, list[tuple[int, str]]]:
        """Per cluster Fleet, each placeable machine's cards of the need and its name."""
        if self._machines is None:
            machines = cluster_machines_placeable(self.clusters, self.now) if self.clusters else {}
            series = card_series(
                card["name"]
                for listed in machines.values()
                for machine in listed
                for card in machine["cards"]
            )
            self._machines = {
                fleet_id: [
                    (self._held(cards_summary(machine, series)), machine["name"])
                    for machine in listed
                ]
                for fleet_id, listed in machines.items()
            }
        return self._machines


# Per Fleet, over its counted nodes' rows (P8): what a node counts, whether it lists its
# devices and whether it is placeable now are computed once, in the inner query, and the
# aggregate reads them (PostgreSQL and SQLite alike). A node holds what it counts only if it
# lists its devices (Q9).
FIT_SQL = """
WITH counted AS MATERIALIZED ({counted}),
held AS (SELECT fleet_id, counted, CASE WHEN listed THEN counted ELSE 0 END AS held, now
         FROM counted)
SELECT fleet_id, MAX(held), COUNT(*) FILTER (WHERE held >= %s),
       SUM(held) FILTER (WHERE held >= %s),
       COUNT(*) FILTER (WHERE held < %s AND counted >= %s),
       COALESCE(MAX(counted) FILTER (WHERE held < %s AND counted >= %s), 0),
       COUNT(*) FILTER (WHERE held >= %s AND now)
FROM held GROUP BY fleet_id
"""

# The allocator holds a node's cards by device, index and UUID, and only those its inventory
# lists (placement.services.allocator): a node listing none holds nothing (Q9). Where it lists
# them, its kept counts are its devices' (less the unhealthy, by series through CardAlias), as
# the allocator counts them: an inventory's devices name as many cards of each name as its
# cards count, or it is refused (nodes.inventory.normalize_inventory).
DEVICES_LISTED = Q(inventory__devices__0__isnull=False)


def _cards_counted(need: Need):
    """A node's cards of the series asked, or of any series, as its row keeps them (J4); a
    card no admin has mapped never counts for a pinned series. Held only if DEVICES_LISTED."""
    if not need.series:
        return F("card_count")
    return Coalesce(Cast(KeyTransform(need.series, "series_cards"), IntegerField()), 0)


def _refuse(reason: str, message: str, **details) -> PlacementRefused:
    return PlacementRefused(message, reason=reason, **details)


def _best_offer(fits: dict[str, FleetFit], need: Need) -> str:
    """The largest fit that does exist, among the Fleets the submitter can see."""
    best = min(fits.values(), key=lambda fit: (-fit.largest, fit.fleet_id), default=None)
    if best is None or best.largest == 0:
        return f"no node of a Fleet you can see holds {need.series or 'cards'}"
    return f"largest fit: {best.largest} × {need.series or 'cards'} on one node in {best.fleet_id}"


def _without_runtime(need: Need, message: str) -> str:
    """A refusal of a workload naming an image says so: what it lacked may be the runtime."""
    if not need.container:
        return message
    return (
        f"{message} It names an image: there is no node with a container runtime "
        "(docker or podman) that fits it."
    )


def _over_limits(project, fleet_ids: list[str], need: Need) -> dict[str, str]:
    """Q2: the Fleets among ``fleet_ids`` where the request can never fit its project's limit,
    each with the arithmetic: the quota it counts against as the allocator reads it (its
    series', else its any card's), holding nothing. One query."""
    rows: dict[str, dict] = {}
    for fleet_id, series, limit in Quota.objects.filter(
        project=project, fleet_id__in=fleet_ids, series__in={need.series, ""}
    ).values_list("fleet_id", "series", "limit"):
        rows.setdefault(fleet_id, {})[(project.pk, series)] = QuotaRow(limit=limit)
    asked = need.cards * need.nodes
    over = {}
    for fleet_id, quotas in rows.items():
        book = Book(rows=quotas)
        key = book.key(project.pk, need.series)
        if not book.within_limit(key, asked):
            over[fleet_id] = (
                f"project {project.slug} may hold at most {book.row(key).limit} "
                f"{key[1] or 'cards'} on {fleet_id}; this asks {asked} (rule Q2)."
            )
    return over


def _check_fit(candidates: list, need: Need, now):
    holdings = Holdings(candidates, need, now)
    fits = holdings.per_fleet()
    return [fit for fit in fits.values() if fit.fits(need)], fits, holdings


@measured_admission
def admit_named(project, fleet_id: str, need: Need, now=None) -> Admitted:
    """A Fleet the submitter named: every gate on it, in order."""
    fleet = fleet_get_open_to(project, fleet_id)
    if need.capability not in fleet.capabilities or (need.kinds and fleet.kind not in need.kinds):
        raise _refuse(
            Refusal.CAPABILITY,
            f"Fleet '{fleet.id}' cannot {need.capability}"
            + (
                f" for this workload (it needs a {' or '.join(need.kinds)} Fleet)"
                if need.kinds and fleet.kind not in need.kinds
                else ""
            )
            + ": a capability is a promise, and this one was not made (rule F3).",
        )
    if fleet.state != FleetState.ACTIVE:
        raise _refuse(
            Refusal.STATE, f"Fleet '{fleet.id}' is {fleet.state}: it takes no new work (rule D1)."
        )
    over = _over_limits(project, [fleet.id], need)
    if over:
        raise _refuse(Refusal.QUOTA, over[fleet.id])
    if not need.checks_fit:
        return Admitted(fleet.id, GATES[:3])
    fitting, fits, holdings = _check_fit([fleet], need, now)
    if not fitting:
        raise _refuse(
            Refusal.INVENTORY_FIT,
            _without_runtime(
                need,
                f"Fleet '{fleet.id}' has no nodes for {need.describe()}, counting those "
                f"coming back and none leaving (rule P8); {_best_offer(fits, need)}."
                + holdings.without_devices(fits)
                + holdings.leaving(fits),
            ),
            best_offer=_best_offer(fits, need),
        )
    return Admitted(fleet.id, GATES, holdings.fitting_nodes(fleet.id))


@measured_admission
def admit_automatically(project, need: Need, now=None) -> Admitted:
    """P1, P4: among every Fleet open to the project that passes every gate, one that fits on
    its nodes placeable now before one that fits only counting those coming back (P8), then
    the one with the most fitting cards, then the smallest id — deterministic."""
    visible = list(
        fleets_open_to(project)
        .select_related(None)
        .order_by("id")
        .values_list("id", "kind", "capabilities", "state", named=True)
    )
    able = [
        f
        for f in visible
        if need.capability in f.capabilities and (not need.kinds or f.kind in need.kinds)
    ]
    if not able:
        kinds = f" among {' and '.join(need.kinds)} Fleets" if need.kinds else ""
        raise _refuse(Refusal.CAPABILITY, f"No Fleet you can see can {need.capability}{kinds}.")
    active = [f for f in able if f.state == FleetState.ACTIVE]
    if not active:
        raise _refuse(
            Refusal.STATE,
            f"Every Fleet you can see that can {need.capability} is "
            "draining or disabled: none takes new work (rule D1).",
        )
    over = _over_limits(project, [f.id for f in active], need)
    if over and len(over) == len(active):
        raise _refuse(Refusal.QUOTA, " ".join(over[f.id] for f in active))
    active = [f for f in active if f.id not in over]
    if not need.checks_fit:
        return Admitted(active[0].id, GATES[:3])
    fitting, fits, holdings = _check_fit(active, need, now)
    if not fitting:
        offer = _best_offer(fits, need)
        raise _refuse(
            Refusal.INVENTORY_FIT,
            _without_runtime(
                need,
                f"No Fleet you can see fits {need.describe()}, counting nodes coming back "
                f"and none leaving (rule P8); {offer}."
                + holdings.without_devices(fits)
                + holdings.leaving(fits),
            ),
            best_offer=offer,
        )
    chosen = min(
        fitting, key=lambda fit: (not fit.fits_now(need), -fit.fitting_cards, fit.fleet_id)
    )
    return Admitted(chosen.fleet_id, GATES, holdings.fitting_nodes(chosen.fleet_id))


@measured_admission
def admit_deployment(project, fleet_id: str | None, need: Need, now=None) -> Admitted:
    """P2: named by the submitter; unnamed, the one serving Fleet open to the project."""
    if fleet_id:
        return admit_named(project, fleet_id, need, now)
    serving = [
        fleet.id
        for fleet in fleets_open_to(project).order_by("id")
        if need.capability in fleet.capabilities
    ]
    if not serving:
        raise _refuse(Refusal.CAPABILITY, "No Fleet you can see can serve.")
    if len(serving) > 1:
        raise _refuse(
            Refusal.FLEET_NOT_NAMED,
            "More than one Fleet you can see can serve: name "
            f'one in "fleet" ({", ".join(serving)}). A deployment\'s Fleet is never '
            "chosen for you among several (rule P2).",
            candidates=serving,
        )
    return admit_named(project, serving[0], need, now)
