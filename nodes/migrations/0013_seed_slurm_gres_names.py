"""Card names as current cluster managers spell them, so a Slurm Fleet places by series
without an admin mapping each: Slurm's gres types as clusters commonly name them
(``gpu:h100:8``: lower-case, the model alone). Where a gres type is the series slug, a job
pinning the series is handed over with the cluster's own spelling.

``a100`` alone says nothing of the memory: it is a series of its own ("any A100"), apart
from a100-80gb and a100-40gb, so that a job needing 80 GB is never placed on a card that
may have 40. A registry entry, not a Fleet (F6); an admin may remap any of these.
"""

from django.db import migrations

NEW_SERIES = {
    "a100": ("NVIDIA A100 (memory size not given)", "nvidia"),
    "a10": ("NVIDIA A10", "nvidia"),
    "v100": ("NVIDIA V100", "nvidia"),
}
# card name -> series slug
NAMES = {
    # Slurm gres types
    "h100": "h100",
    "h200": "h200",
    "b200": "b200",
    "a100": "a100",
    "a100_80gb": "a100-80gb",
    "a100-80gb": "a100-80gb",
    "a100_40gb": "a100-40gb",
    "a100-40gb": "a100-40gb",
    "l40s": "l40s",
    "l4": "l4",
    "a10": "a10",
    "a10g": "a10g",
    "v100": "v100",
    "mi300x": "mi300x",
    "mi250x": "mi250x",
    # nvidia-smi's names of the new series, and GPU feature discovery's (dashes for spaces)
    "NVIDIA A10": "a10",
    "NVIDIA-A10": "a10",
    "Tesla V100-SXM2-16GB": "v100",
    "Tesla-V100-SXM2-16GB": "v100",
    "Tesla V100-SXM2-32GB": "v100",
    "Tesla-V100-SXM2-32GB": "v100",
    "Tesla V100-PCIE-16GB": "v100",
    "Tesla-V100-PCIE-16GB": "v100",
    "Tesla V100-PCIE-32GB": "v100",
    "Tesla-V100-PCIE-32GB": "v100",
}


def seed(apps, schema_editor):
    HardwareSeries = apps.get_model("nodes", "HardwareSeries")
    CardAlias = apps.get_model("nodes", "CardAlias")
    for slug, (name, vendor) in NEW_SERIES.items():
        HardwareSeries.objects.get_or_create(slug=slug, defaults={"name": name, "vendor": vendor})
    series = {s.slug: s for s in HardwareSeries.objects.filter(slug__in=set(NAMES.values()))}
    for name, slug in NAMES.items():
        if slug not in series:  # an admin deleted a seeded series: not brought back
            continue
        # A name seen already is left as it is: an admin maps it, and the nodes reporting it
        # follow through the service (a migration cannot update their card summaries).
        CardAlias.objects.get_or_create(name=name, defaults={"series": series[slug]})


def unseed(apps, schema_editor):
    CardAlias = apps.get_model("nodes", "CardAlias")
    CardAlias.objects.filter(name__in=list(NAMES), first_seen_at__isnull=True).delete()
    apps.get_model("nodes", "HardwareSeries").objects.filter(
        slug__in=list(NEW_SERIES), aliases__isnull=True
    ).delete()


class Migration(migrations.Migration):
    dependencies = [("nodes", "0012_drain_reason_and_last_session")]
    operations = [migrations.RunPython(seed, unseed)]
