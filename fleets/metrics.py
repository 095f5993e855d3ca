"""Fleets for Prometheus, read from the database at each scrape of the web's /metrics: how
many of each kind are in each state."""

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily

from .models import Fleet


class FleetsCollector:
    def collect(self):
        fleets = GaugeMetricFamily(
            "tuneplane_fleets", "Fleets by kind and state.", labels=["kind", "state"]
        )
        for row in Fleet.objects.values("kind", "state").annotate(n=Count("id")).order_by():
            fleets.add_metric([row["kind"], row["state"]], row["n"])
        yield fleets
