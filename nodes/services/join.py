"""Join tokens and joins: every write validated, in one transaction, audited."""

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.services import Actor, audit_record
from fleets.choices import FleetKind
from fleets.models import Fleet
from fleets.services import fleet_hold
from tuneplane.errors import ApplicationError, Conflict, ValidationFailed
from tuneplane.models import hash_secret, new_secret
from tuneplane.windows import first_in_window

from .. import pki
from ..downloads import lock_sha256
from ..inventory import normalize_inventory
from ..metrics import JOINS
from ..models import JoinToken, Node, NodeCredential, new_node_id
from ..selectors import (
    cards_summary,
    nodes_answering_at,
    nodes_with_fingerprint,
    unknown_cards,
)
from .hardware import card_names_remember

logger = logging.getLogger("tuneplane.nodes")

JOIN_REFUSED = (
    "Join refused: this token cannot join this Fleet. It may be unknown, already "
    "used, expired or revoked; ask an administrator for a new one."
)


class JoinRefused(ApplicationError):
    """One answer for every token problem, so a caller learns nothing about which tokens exist."""

    status = 403
    code = "join_refused"

    def __init__(self):
        super().__init__(JOIN_REFUSED)


def join_token_mint(*, actor: Actor, fleet: Fleet) -> tuple[JoinToken, str]:
    """A single-use token for one node Fleet (J1, J2). The secret is returned here only."""
    if fleet.kind != FleetKind.NODE:
        raise Conflict(
            f"Fleet '{fleet.id}' is a {fleet.kind} Fleet: its machines come from the cluster "
            "manager, not from join tokens (rule J1).",
            rule="J1",
            code="not_a_node_fleet",
        )
    made = new_secret(JoinToken.PREFIX)
    now = timezone.now()
    with transaction.atomic():
        token = JoinToken.objects.create(
            fleet=fleet,
            prefix=made.prefix,
            digest=made.digest,
            created_by=actor.user,
            expires_at=now + timedelta(seconds=settings.TUNEPLANE_JOIN_TOKEN_TTL),
        )
        audit_record(
            actor=actor,
            action="join_token.minted",
            target=token,
            after={
                "fleet": fleet.id,
                "prefix": token.prefix,
                "expires_at": token.expires_at.isoformat(),
            },
        )
    return token, made.secret


def join_commands(fleet_id: str, secret: str) -> dict:
    server = settings.TUNEPLANE_PUBLIC_URL.rstrip("/")
    return {
        "install_command": f"curl -fsSL {server}/install.sh | TUNEPLANE_FLEET={fleet_id} "
        f"TUNEPLANE_JOIN_TOKEN={secret} TUNEPLANE_AGENT_SHA256={lock_sha256()} sh",
        "join_command": f"tuneplane-node join --server {server} --fleet {fleet_id} "
        f"--token {secret}",
    }


def join_token_revoke(*, actor: Actor, token: JoinToken) -> JoinToken:
    with transaction.atomic():
        token = JoinToken.objects.select_for_update().get(pk=token.pk)
        if token.revoked_at is None and token.used_at is None:
            token.revoked_at = timezone.now()
            token.save(update_fields=["revoked_at"])
            audit_record(
                actor=actor,
                action="join_token.revoked",
                target=token,
                before={"revoked_at": None},
                after={"revoked_at": token.revoked_at.isoformat()},
            )
    return token


@dataclass
class JoinResult:
    node: Node
    certificate: pki.IssuedCertificate
    ca_bundle: str
    warnings: list[dict] = field(default_factory=list)


def _refusal_reason(digest: str, fleet_id: str, now) -> tuple[str, JoinToken | None]:
    token = JoinToken.objects.filter(digest=digest).first()
    if token is None:
        return "unknown token", None
    if token.fleet_id != fleet_id:
        return "token is for another Fleet", token
    if token.revoked_at is not None:
        return "token revoked", token
    if token.used_at is not None:
        return "token already used", token
    if token.expires_at <= now:
        return "token expired", token
    return "token not redeemable", token


# Refusals from one client for one reason: one audit event and one log line a window,
# carrying how many there were, so an anonymous client cannot grow the audit table.
REFUSAL_WINDOW = 60


def _refuse(digest: str, fleet_id: str, client_address: str, now) -> JoinRefused:
    reason, token = _refusal_reason(digest, fleet_id, now)
    JOINS.labels("refused", reason).inc()
    count = first_in_window("join-refused", client_address, reason, seconds=REFUSAL_WINDOW)
    if not count:
        return JoinRefused()
    target = token if token is not None else ("nodes.jointoken", f"sha256:{digest[:12]}")
    with transaction.atomic():
        audit_record(
            actor=Actor.system("join"),
            action="node.join_refused",
            target=target,
            after={
                "reason": reason,
                "fleet": fleet_id[:63],
                "client": client_address,
                "count": count,
                "window_seconds": REFUSAL_WINDOW,
            },
        )
    logger.warning(
        "join refused: %s (fleet %r, token %s, from %r; %d since the last such line)",
        reason,
        fleet_id[:63],
        token.pk if token else f"sha256:{digest[:12]}",
        client_address,
        count,
    )
    return JoinRefused()


def _others(nodes, fleet_id: str) -> tuple[list[str], int]:
    """Nodes of the joining machine's own Fleet by id; of any other Fleet only how many: a
    join token is for one Fleet, and tells nothing of another's nodes."""
    rows = list(nodes.values_list("id", "fleet_id")[:5])
    own = [node_id for node_id, other_fleet in rows if other_fleet == fleet_id]
    return own, len(rows) - len(own)


def _join_warnings(node: Node, inventory: dict, now) -> list[dict]:
    warnings = []
    answering = (
        nodes_answering_at(node.address, now=now, exclude_id=node.id)
        if node.address
        else Node.objects.none()
    )
    own, foreign = _others(answering, node.fleet_id)
    for other in own:
        warnings.append(
            {
                "code": "address_in_use",
                "node": other,
                "address": node.address,
                "message": f"Another node ({other}) answers at {node.address}. If this machine "
                "re-joined, remove the old record, or the console counts its cards twice.",
            }
        )
    if foreign:
        warnings.append(
            {
                "code": "address_in_use",
                "count": foreign,
                "address": node.address,
                "message": f"{foreign} node(s) of another Fleet answer at {node.address}. "
                "If this machine moved Fleets, have an administrator remove the old record.",
            }
        )
    own, foreign = _others(
        nodes_with_fingerprint(node.fingerprint, exclude_id=node.id), node.fleet_id
    )
    for other in own:
        warnings.append(
            {
                "code": "same_machine",
                "node": other,
                "message": f"This machine's fingerprint matches node {other}, which still "
                "exists. If it is this machine's old record, remove it.",
            }
        )
    if foreign:
        warnings.append(
            {
                "code": "same_machine",
                "count": foreign,
                "message": f"This machine's fingerprint matches {foreign} node(s) of another "
                "Fleet, which still exist. If one is this machine's old record, have an "
                "administrator remove it.",
            }
        )
    cards = sum(card["count"] for card in inventory["cards"])
    if cards and not inventory.get("devices"):
        warnings.append(
            {
                "code": "no_devices",
                "cards": cards,
                "message": f"The inventory counts {cards} card(s) but lists no devices: cards "
                "are held by index and UUID, so no work is placed on this node and it counts "
                'toward no fit (rule Q9). List each card in the inventory\'s "devices" as '
                '{"index": 0, "uuid": "GPU-...", "name": "..."}, as tuneplane-node reports '
                "them from nvidia-smi (an --inventory-file must list them too).",
            }
        )
    for name in unknown_cards(inventory):
        warnings.append(
            {
                "code": "unknown_card",
                "card": name,
                "message": f"Card '{name}' is not in the hardware registry. Jobs that pin a series "
                "are not placed here until an administrator maps it.",
            }
        )
    return warnings


def node_join(
    *,
    token: str,
    fleet_id: str,
    csr: str,
    inventory,
    address: str = "",
    hostname: str = "",
    fingerprint: str = "",
    agent_version: str = "",
    client_address: str = "",
) -> JoinResult:
    """Redeem a join token: exactly one caller wins it, and gets an identity once (J2, J3).

    The body's shape (CSR, inventory) is checked before the token is looked at, so
    a 400 naming a field says nothing about tokens; every token problem is one
    generic refusal, with the precise reason in the audit log and the server log.
    """
    parsed_csr = pki.parse_csr(csr)
    inventory = normalize_inventory(inventory)
    if not isinstance(token, str) or not token or len(token) > 200:
        raise ValidationFailed("token is required.", field="token")
    digest = hash_secret(token)
    now = timezone.now()
    lifetime = timedelta(seconds=settings.TUNEPLANE_NODE_CREDENTIAL_TTL)
    with transaction.atomic():
        # One conditional UPDATE on the token row alone: concurrent redemptions queue on
        # its lock and PostgreSQL re-checks the WHERE for each, so all but the first find
        # used_at set (J2). No join in this filter: Django would turn it into
        # "id IN (subquery)", whose snapshot is not re-checked, and every racer would win.
        # Tokens exist only for node Fleets (J1 at mint; kind never changes).
        # The Fleet first, as a deletion takes it: a join racing a deletion then waits for
        # it (and finds its token gone) instead of deadlocking with it (F7).
        held = isinstance(fleet_id, str) and fleet_hold(fleet_id)
        won = (
            JoinToken.objects.filter(
                digest=digest,
                fleet_id=fleet_id,
                used_at__isnull=True,
                revoked_at__isnull=True,
                expires_at__gt=now,
            ).update(used_at=now)
            if held
            else 0
        )
        if won == 1:
            join_token = JoinToken.objects.select_related("fleet").get(digest=digest)
            node = Node.objects.create(
                id=new_node_id(),
                fleet=join_token.fleet,
                hostname=hostname[:253],
                address=address[:300],
                fingerprint=fingerprint[:64],
                agent_version=agent_version[:64],
                inventory=inventory,
                inventory_observed_at=now,
                last_seen_at=now,
                **cards_summary(inventory),
            )
            certificate = pki.sign_node_csr(parsed_csr, node.id, lifetime)
            NodeCredential.objects.create(
                node=node,
                serial=certificate.serial,
                fingerprint_sha256=certificate.fingerprint_sha256,
                not_before=certificate.not_before,
                not_after=certificate.not_after,
            )
            join_token.node = node
            join_token.save(update_fields=["node"])
            card_names_remember((card["name"] for card in inventory["cards"]), now)
            warnings = _join_warnings(node, inventory, now)
            audit_record(
                actor=Actor.of_node(node.id),
                action="node.joined",
                target=node,
                after={
                    "fleet": node.fleet_id,
                    "hostname": node.hostname,
                    "address": node.address,
                    "token": join_token.prefix,
                    "credential_serial": certificate.serial,
                    "inventory": inventory,
                    "warnings": [w["code"] for w in warnings],
                },
            )
    if won != 1:
        raise _refuse(digest, str(fleet_id), client_address, now)
    logger.info("node %s joined fleet %s from %r", node.id, node.fleet_id, client_address)
    JOINS.labels("joined", "").inc()
    return JoinResult(
        node=node, certificate=certificate, ca_bundle=pki.load_ca().pem, warnings=warnings
    )
