"""Common data-centre cards, so a fresh console maps them without an admin's help.

A registry entry, not a Fleet (F6). Each NVIDIA name is stored as nvidia-smi
spells it and as GPU feature discovery labels it (spaces become dashes).
"""

from django.db import migrations

SERIES = {
    ("h100", "NVIDIA H100", "nvidia"): ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe",
                                        "NVIDIA H100 NVL"],
    ("h200", "NVIDIA H200", "nvidia"): ["NVIDIA H200", "NVIDIA H200 NVL"],
    ("b200", "NVIDIA B200", "nvidia"): ["NVIDIA B200"],
    ("a100-80gb", "NVIDIA A100 80GB", "nvidia"): ["NVIDIA A100-SXM4-80GB",
                                                  "NVIDIA A100 80GB PCIe"],
    ("a100-40gb", "NVIDIA A100 40GB", "nvidia"): ["NVIDIA A100-SXM4-40GB",
                                                  "NVIDIA A100-PCIE-40GB"],
    ("l40s", "NVIDIA L40S", "nvidia"): ["NVIDIA L40S"],
    ("l4", "NVIDIA L4", "nvidia"): ["NVIDIA L4"],
    ("a10g", "NVIDIA A10G", "nvidia"): ["NVIDIA A10G"],
    ("mi300x", "AMD Instinct MI300X", "amd"): ["AMD Instinct MI300X"],
    ("mi250x", "AMD Instinct MI250X", "amd"): ["AMD Instinct MI250X"],
}


def spellings(name: str) -> set[str]:
    return {name, name.replace(" ", "-")} if name.startswith("NVIDIA") else {name}


def seed(apps, schema_editor):
    HardwareSeries = apps.get_model("nodes", "HardwareSeries")
    CardAlias = apps.get_model("nodes", "CardAlias")
    for (slug, name, vendor), cards in SERIES.items():
        series, _ = HardwareSeries.objects.get_or_create(
            slug=slug, defaults={"name": name, "vendor": vendor})
        for card in cards:
            for spelling in spellings(card):
                CardAlias.objects.get_or_create(name=spelling, defaults={"series": series})


def unseed(apps, schema_editor):
    apps.get_model("nodes", "CardAlias").objects.filter(
        series__slug__in=[slug for slug, _, _ in SERIES]).delete()
    apps.get_model("nodes", "HardwareSeries").objects.filter(
        slug__in=[slug for slug, _, _ in SERIES]).delete()


class Migration(migrations.Migration):
    dependencies = [("nodes", "0001_initial")]
    operations = [migrations.RunPython(seed, unseed)]
