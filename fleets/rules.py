"""The rules a Fleet's fields obey, shared by the services and the admin form."""

import re

from tuneplane.errors import ValidationFailed
from tuneplane.models import SLUG_PATTERN

from .choices import (
    DEFAULT_DELIVERY,
    FleetCapability,
    FleetDelivery,
    FleetKind,
    FleetState,
    FleetVisibility,
)

_SLUG = re.compile(SLUG_PATTERN)


def validate_id(fleet_id) -> str:
    if not isinstance(fleet_id, str) or not fleet_id:
        raise ValidationFailed("id is required and must be a string.", field="id")
    if not _SLUG.match(fleet_id):
        raise ValidationFailed(
            f"id '{fleet_id[:80]}' is not a lowercase slug: use 1–63 lowercase letters, digits "
            "and hyphens, starting and ending with a letter or digit.",
            field="id",
        )
    return fleet_id


def validate_choice(field: str, value, choices: type) -> str:
    if value not in choices.values:
        allowed = ", ".join(choices.values)
        raise ValidationFailed(f"{field} '{value}' is not one of: {allowed}.", field=field)
    return value


def normalize_capabilities(capabilities) -> list[str]:
    """F3: a subset of train, eval, serve and env, each named once; stored sorted."""
    if not isinstance(capabilities, (list, tuple)):
        raise ValidationFailed("capabilities must be a list.", field="capabilities")
    seen = set()
    for capability in capabilities:
        validate_choice("capabilities", capability, FleetCapability)
        if capability in seen:
            raise ValidationFailed(
                f"capabilities names '{capability}' twice.", field="capabilities"
            )
        seen.add(capability)
    return sorted(seen)


def resolve_delivery(kind: str, delivery: str | None) -> str:
    """F2: the delivery follows the backend unless given."""
    if delivery in (None, ""):
        return DEFAULT_DELIVERY[kind]
    return validate_choice("delivery", delivery, FleetDelivery)


def validate_visibility(visibility: str, project) -> None:
    validate_choice("visibility", visibility, FleetVisibility)
    if visibility == FleetVisibility.PROJECT and project is None:
        raise ValidationFailed("a project Fleet must name its project.", field="project")
    if visibility == FleetVisibility.PUBLIC and project is not None:
        raise ValidationFailed(
            "only a project Fleet names a project; set visibility to 'project' to make it one.",
            field="project",
        )


def validate_kind(kind) -> str:
    return validate_choice("kind", kind, FleetKind)


def validate_state(state) -> str:
    return validate_choice("state", state, FleetState)


IMMUTABLE_REASONS = {
    "id": "a Fleet's id is its name everywhere a job or deployment records it",
    "kind": "it describes what the machines are",
    "delivery": "re-pointing it relocates where every running job writes",
}


def refuse_change(field: str, current: str, requested: str) -> None:
    """F1: kind and delivery (and the id) never change after creation."""
    if requested != current:
        raise ValidationFailed(
            f"{field} cannot change after a Fleet is created (rule F1): "
            f"{IMMUTABLE_REASONS[field]}. It is '{current}'.",
            code="immutable",
            field=field,
            rule="F1",
        )
