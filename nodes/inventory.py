"""What a node reports about itself: cards, driver, runtime, storage root, budgets (J4).

The same shape arrives at join and, later, over the control stream; it is the
format of ``tuneplane-node --inventory-file`` too.
"""

from tuneplane.errors import ValidationFailed

MAX_CARD_KINDS = 16  # distinct card names in one report
MAX_CARDS = 1024
MAX_TEXT = 200
MAX_CPU_BUDGET = 1 << 20  # CPUs
MAX_MEMORY_BUDGET_BYTES = 1 << 60  # an exbibyte


def has_container_runtime(inventory: dict) -> bool:
    """Whether a node reported a container runtime (docker or podman, with its version): a
    workload naming an image runs only there (DESIGN §7)."""
    return bool((inventory.get("container_runtime") or "").strip())


def _text(value, field: str, *, required: bool = False) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value.strip()) or len(value) > MAX_TEXT:
        raise ValidationFailed(
            f"{field} must be a string of at most {MAX_TEXT} characters.", field=field
        )
    return value


def _count(value, field: str, *, minimum: int, maximum: int, required: bool = False) -> int | None:
    """A whole number within bounds: a node's report is hostile input, and 10**400 is an
    int to Python but nothing a machine has."""
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ValidationFailed(
            f"{field} must be a whole number from {minimum} to {maximum}.", field=field
        )
    return value


def _devices(devices, totals: dict[str, int]) -> list[dict]:
    """Each card by index and UUID (what the allocator holds, R1): indices and UUIDs each
    once, and as many of each name as ``cards`` counts."""
    if devices is None or devices == []:
        return []
    field = "inventory.devices"
    if not isinstance(devices, list) or len(devices) > MAX_CARDS:
        raise ValidationFailed(f"{field} must be a list of at most {MAX_CARDS}.", field=field)
    found, counts = [], {}
    for position, device in enumerate(devices):
        here = f"{field}[{position}]"
        if not isinstance(device, dict) or set(device) != {"index", "uuid", "name"}:
            raise ValidationFailed(f'{here} must be {{"index", "uuid", "name"}}.', field=here)
        index = _count(
            device["index"], f"{here}.index", minimum=0, maximum=MAX_CARDS - 1, required=True
        )
        uuid = _text(device["uuid"], f"{here}.uuid", required=True).strip()
        name = _text(device["name"], f"{here}.name", required=True).strip()
        counts[name] = counts.get(name, 0) + 1
        found.append({"index": index, "uuid": uuid, "name": name})
    if len({d["index"] for d in found}) != len(found) or len({d["uuid"] for d in found}) != len(
        found
    ):
        raise ValidationFailed(f"{field}: each index and each UUID once.", field=field)
    if counts != totals:
        raise ValidationFailed(
            f"{field} must name as many cards of each name as inventory.cards counts.",
            field=field,
        )
    return sorted(found, key=lambda device: device["index"])


def normalize_inventory(data) -> dict:
    if not isinstance(data, dict):
        raise ValidationFailed("inventory must be a JSON object.", field="inventory")
    known = {
        "cards",
        "driver",
        "container_runtime",
        "storage_root_visible",
        "cpu_budget",
        "memory_budget_bytes",
        "devices",
    }
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValidationFailed(
            f"inventory.{unknown[0]} is not an inventory field.", field=f"inventory.{unknown[0]}"
        )
    cards = data.get("cards", [])
    if not isinstance(cards, list) or len(cards) > MAX_CARD_KINDS:
        raise ValidationFailed(
            f"inventory.cards must be a list of at most {MAX_CARD_KINDS}.", field="inventory.cards"
        )
    totals: dict[str, int] = {}
    for index, card in enumerate(cards):
        field = f"inventory.cards[{index}]"
        if not isinstance(card, dict) or set(card) - {"name", "count"}:
            raise ValidationFailed(f'{field} must be {{"name", "count"}}.', field=field)
        name = _text(card.get("name"), f"{field}.name", required=True).strip()
        count = _count(
            card.get("count"), f"{field}.count", minimum=1, maximum=MAX_CARDS, required=True
        )
        totals[name] = totals.get(name, 0) + count
    if sum(totals.values()) > MAX_CARDS:
        raise ValidationFailed(
            f"inventory.cards counts more than {MAX_CARDS} cards.", field="inventory.cards"
        )
    visible = data.get("storage_root_visible", False)
    if not isinstance(visible, bool):
        raise ValidationFailed(
            "inventory.storage_root_visible must be true or false.",
            field="inventory.storage_root_visible",
        )
    devices = _devices(data.get("devices"), totals)
    return {
        **({"devices": devices} if devices else {}),
        "cards": [{"name": name, "count": count} for name, count in sorted(totals.items())],
        "driver": _text(data.get("driver"), "inventory.driver"),
        "container_runtime": _text(data.get("container_runtime"), "inventory.container_runtime"),
        "storage_root_visible": visible,
        "cpu_budget": _count(
            data.get("cpu_budget"), "inventory.cpu_budget", minimum=1, maximum=MAX_CPU_BUDGET
        ),
        "memory_budget_bytes": _count(
            data.get("memory_budget_bytes"),
            "inventory.memory_budget_bytes",
            minimum=1,
            maximum=MAX_MEMORY_BUDGET_BYTES,
        ),
    }
