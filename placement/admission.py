"""Admission: which Fleet takes a workload, or exactly why none can (P1–P7, F3, F8, L1).

The gates, in order: the named Fleet is visible (404, the same answer as a Fleet that does
not exist), it has the capability, it is active, the inventory fits. Automatic choice runs
the same gates over every visible Fleet and never counts, names or hints at one the
submitter cannot see. Inventory fit is a check, not a reservation (P7).

Queries do not depend on the number of nodes or Fleets: the visible Fleets, then one
statement that sums each placeable node's cards of the series and aggregates per Fleet.
"""

from dataclasses import dataclass, field

from django.core.exceptions import EmptyResultSet
from django.db import connection
from django.utils import timezone

from fleets.choices import FleetKind, FleetState
from fleets.models import Fleet
from fleets.selectors import fleet_get_visible, fleets_visible_to
from nodes.selectors import card_series, nodes_placeable
from tuneplane.errors import PlacementRefused

from .choices import Refusal

GATES = ["visibility", "capability", "state", "inventory_fit"]


@dataclass(frozen=True)
class Need:
    """What a workload asks of a Fleet."""

    capability: str
    series: str = ""
    cards: int = 0  # per node; 0 asks for no cards, and skips the fit gate
    nodes: int = 1
    kinds: tuple[str, ...] = ()  # the backends allowed; empty: any

    def describe(self) -> str:
        cards = f"{self.cards} × {self.series or 'any card'}"
        return cards + (f" on each of {self.nodes} nodes" if self.nodes > 1 else " on one node")


@dataclass
class FleetFit:
    """How a Fleet's placeable nodes hold a need: a check, not a reservation (P7)."""

    fleet: Fleet
    largest: int = 0  # the most matching cards on one placeable node
    fitting_count: int = 0  # placeable nodes holding the cards asked per node
    fitting_cards: int = 0  # the matching cards on those nodes
    best: list[str] = field(default_factory=list)  # some of those nodes, most cards first

    def fits(self, need: "Need") -> bool:
        return self.fitting_count >= need.nodes


@dataclass
class Admitted:
    fleet: Fleet
    gates: list[str]
    nodes: list[str] = field(default_factory=list)  # where it fits, best first

    def as_record(self) -> dict:
        return {"fleet": self.fleet.id, "gates": self.gates, "fits_on": self.nodes[:8]}


# Per placeable node, the cards of the series it holds (a card the registry has not
# mapped never counts for a pinned series, J4); per Fleet, what fits. At most one row a
# Fleet comes back, whatever the number of nodes.
FIT_SQL = """
WITH placeable AS ({placeable}),
per_node AS (
  SELECT n.id, n.fleet_id,
         COALESCE(SUM((card.value->>'count')::int)
                  FILTER (WHERE %s = '' OR series.slug = %s), 0) AS cards
  FROM nodes_node n
  LEFT JOIN LATERAL jsonb_array_elements(n.inventory->'cards') AS card ON true
  LEFT JOIN nodes_cardalias alias ON alias.name = card.value->>'name'
  LEFT JOIN nodes_hardwareseries series ON series.id = alias.series_id
  WHERE n.id IN (SELECT id FROM placeable)
  GROUP BY n.id, n.fleet_id
)
SELECT fleet_id, MAX(cards), COUNT(*) FILTER (WHERE cards >= %s),
       COALESCE(SUM(cards) FILTER (WHERE cards >= %s), 0),
       (ARRAY_AGG(id ORDER BY cards DESC, id) FILTER (WHERE cards >= %s))[1:8]
FROM per_node GROUP BY fleet_id
"""


def fits_of(fleets: list[Fleet], need: Need, now=None) -> dict[str, FleetFit]:
    """Each Fleet's placeable nodes against the need. Cluster Fleets' inventory snapshots
    are not read yet: until then they hold nothing."""
    fits = {fleet.id: FleetFit(fleet) for fleet in fleets}
    placeable = nodes_placeable([f.id for f in fleets if f.kind == FleetKind.NODE], now)
    if connection.vendor == "postgresql":
        rows = _fits_in_sql(placeable, need)
    else:
        rows = _fits_in_python(placeable, need)
    for fleet_id, largest, count, cards, best in rows:
        fits[fleet_id] = FleetFit(fits[fleet_id].fleet, largest, count, cards, list(best or []))
    return fits


def _fits_in_sql(placeable, need: Need) -> list[tuple]:
    try:
        sql, params = placeable.order_by().values("id").query.sql_with_params()
    except EmptyResultSet:
        return []
    with connection.cursor() as cursor:
        cursor.execute(FIT_SQL.format(placeable=sql),
                       [*params, need.series, need.series, need.cards, need.cards, need.cards])
        return cursor.fetchall()


def _fits_in_python(placeable, need: Need) -> list[tuple]:
    """The same, where the database cannot unnest JSON (SQLite, the embedded default)."""
    nodes = list(placeable.values_list("id", "fleet_id", "inventory"))
    series = card_series(card["name"] for _, _, inventory in nodes
                         for card in inventory.get("cards", []))
    per_fleet: dict[str, list[tuple[int, str]]] = {}
    for node_id, fleet_id, inventory in nodes:
        cards = sum(card["count"] for card in inventory.get("cards", [])
                    if not need.series or series.get(card["name"]) == need.series)
        per_fleet.setdefault(fleet_id, []).append((cards, node_id))
    rows = []
    for fleet_id, held in per_fleet.items():
        fitting = sorted((item for item in held if item[0] >= need.cards),
                         key=lambda item: (-item[0], item[1]))
        rows.append((fleet_id, max(cards for cards, _ in held), len(fitting),
                     sum(cards for cards, _ in fitting), [node for _, node in fitting[:8]]))
    return rows


def _refuse(reason: str, message: str, **details) -> PlacementRefused:
    return PlacementRefused(message, reason=reason, **details)


def _best_offer(fits: dict[str, FleetFit], need: Need) -> str:
    """The largest fit that does exist, among the Fleets the submitter can see."""
    best = min(fits.values(), key=lambda fit: (-fit.largest, fit.fleet.id), default=None)
    if best is None or best.largest == 0:
        return f"no placeable node of a Fleet you can see holds {need.series or 'cards'} now"
    return f"largest fit: {best.largest} × {need.series or 'cards'} on one node in {best.fleet.id}"


def _check_fit(candidates: list[Fleet], need: Need, now) -> tuple[list[FleetFit], dict]:
    fits = fits_of(candidates, need, now)
    return [fit for fit in fits.values() if fit.fits(need)], fits


def admit_named(user, fleet_id: str, need: Need, now=None) -> Admitted:
    """A Fleet the submitter named: every gate on it, in order."""
    fleet = fleet_get_visible(user, fleet_id)
    if need.capability not in fleet.capabilities or (need.kinds and fleet.kind not in need.kinds):
        raise _refuse(Refusal.CAPABILITY, f"Fleet '{fleet.id}' cannot {need.capability}"
                      + (f" for this workload (it needs a {' or '.join(need.kinds)} Fleet)"
                         if need.kinds and fleet.kind not in need.kinds else "")
                      + ": a capability is a promise, and this one was not made (rule F3).")
    if fleet.state != FleetState.ACTIVE:
        raise _refuse(Refusal.STATE, f"Fleet '{fleet.id}' is {fleet.state}: it takes no new "
                      "work (rule D1).")
    if need.cards == 0:
        return Admitted(fleet, GATES[:3])
    fitting, fits = _check_fit([fleet], need, now or timezone.now())
    if not fitting:
        raise _refuse(Refusal.INVENTORY_FIT, f"Fleet '{fleet.id}' has no placeable nodes for "
                      f"{need.describe()}; {_best_offer(fits, need)}.",
                      best_offer=_best_offer(fits, need))
    return Admitted(fleet, GATES, fitting[0].best)


def admit_automatically(user, need: Need, now=None) -> Admitted:
    """P1, P4: among every visible Fleet that passes every gate, the one with the most
    fitting cards, then the smallest id — deterministic."""
    visible = list(fleets_visible_to(user).order_by("id"))
    able = [f for f in visible if need.capability in f.capabilities
            and (not need.kinds or f.kind in need.kinds)]
    if not able:
        kinds = f" among {' and '.join(need.kinds)} Fleets" if need.kinds else ""
        raise _refuse(Refusal.CAPABILITY, f"No Fleet you can see can {need.capability}{kinds}.")
    active = [f for f in able if f.state == FleetState.ACTIVE]
    if not active:
        raise _refuse(Refusal.STATE, f"Every Fleet you can see that can {need.capability} is "
                      "draining or disabled: none takes new work (rule D1).")
    if need.cards == 0:
        return Admitted(active[0], GATES[:3])
    fitting, fits = _check_fit(active, need, now or timezone.now())
    if not fitting:
        offer = _best_offer(fits, need)
        raise _refuse(Refusal.INVENTORY_FIT, f"No Fleet you can see fits {need.describe()} "
                      f"now; {offer}.", best_offer=offer)
    chosen = min(fitting, key=lambda fit: (-fit.fitting_cards, fit.fleet.id))
    return Admitted(chosen.fleet, GATES, chosen.best)


def admit_deployment(user, fleet_id: str | None, need: Need, now=None) -> Admitted:
    """P2: named by the submitter; unnamed, the one visible serving Fleet, if there is one."""
    if fleet_id:
        return admit_named(user, fleet_id, need, now)
    serving = [fleet.id for fleet in fleets_visible_to(user).order_by("id")
               if need.capability in fleet.capabilities]
    if not serving:
        raise _refuse(Refusal.CAPABILITY, "No Fleet you can see can serve.")
    if len(serving) > 1:
        raise _refuse(Refusal.FLEET_NOT_NAMED, "More than one Fleet you can see can serve: name "
                      f"one in \"fleet\" ({', '.join(serving)}). A deployment's Fleet is never "
                      "chosen for you among several (rule P2).", candidates=serving)
    return admit_named(user, serving[0], need, now)

