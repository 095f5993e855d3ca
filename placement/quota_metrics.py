"""A shared Fleet's quotas for Prometheus (Q1, Q3), read from the database at each scrape of
the web's /metrics: its own module, since the quotas' reads import the allocator, which
imports placement.metrics."""

from prometheus_client.core import GaugeMetricFamily

from fleets.models import Fleet

from .services.quotas import quota_rows


class QuotaCollector:
    """Q1, Q3: each quota on each node Fleet with quotas — guaranteed, limit (-1 unlimited),
    in use, borrowed, queued, in cards, and its project's fair share — read at the scrape."""

    FIGURES = (
        ("guaranteed", "Cards guaranteed to the project"),
        ("limit", "The most cards the project may hold; -1 unlimited"),
        ("in_use", "Cards the project holds"),
        ("borrowed", "Of those, cards above its guarantee now: in use - guaranteed, or 0"),
        ("queued", "Cards the project's queued jobs ask"),
        ("fair_share", "Cards held now plus recent average, per weight: lower goes first"),
    )

    def collect(self):
        families = {
            name: GaugeMetricFamily(
                f"tuneplane_quota_{name}", text, labels=["fleet", "project", "series"]
            )
            for name, text in self.FIGURES
        }
        for fleet in Fleet.objects.filter(quotas__isnull=False).distinct().order_by("id"):
            for row in quota_rows(fleet):
                labels = [fleet.id, row["project"], row["series"]]
                for name, _ in self.FIGURES:
                    figure = row[name]
                    families[name].add_metric(labels, -1 if figure is None else figure)
        yield from families.values()
