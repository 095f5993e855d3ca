"""A1 for sharing a Fleet (placement.services.quotas, Q1): an administrator replacing a
Fleet's quotas records one event, with the quotas before and after. Merged into SCENARIOS by
test_audit_completeness."""

from audit.services import Actor
from placement.services import quotas
from placement.services.quotas import QuotaSpec

from .scenarios import Scenario, changed

READS = {
    "placement.services.quotas.fleet_quotas",  # reads the rows
    "placement.services.quotas.quota_rows",  # reads the rows and what each holds
}


def quotas_replace(w):
    fleet = w.fleet()
    quotas.quotas_replace(actor=Actor.of_user(w.admin), fleet=fleet, specs=[QuotaSpec("ml")])
    return lambda: quotas.quotas_replace(
        actor=Actor.of_user(w.admin),
        fleet=fleet,
        specs=[QuotaSpec("ml", guaranteed=8, limit=16, weight=2)],
    )


SCENARIOS = {
    "placement.services.quotas.quotas_replace": Scenario(
        quotas_replace, (changed("fleet.quotas_replaced"),)
    ),
}
