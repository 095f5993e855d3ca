"""Prometheus metrics: the web's ``/metrics``, a plain HTTP server for a gateway or a worker,
the Celery tasks' runtime and failures, and the registry of scrape-time collectors the apps
add (each reads its figures from the database when scraped, as F7's checks are registered).

Several processes count into one set of figures where PROMETHEUS_MULTIPROC_DIR is set (the
web's gunicorn workers, the Celery worker's children, beat): each writes its counters into
that directory and ``/metrics`` adds them up. A gateway is one process scraped on its own
port, and keeps out of the directory (manage.py unsets it for grpcserve).
"""

import hmac
import ipaddress
import os
import threading
import time
from wsgiref.simple_server import make_server

from django.conf import settings
from django.http import HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    make_wsgi_app,
    multiprocess,
)
from prometheus_client.exposition import ThreadingWSGIServer, _get_best_family, _SilentHandler

from .client_address import client_address

TASK_DURATION = Histogram(
    "tuneplane_celery_task_duration_seconds",
    "A Celery task's run, from start to end, by task.",
    ["task"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
TASK_FAILURES = Counter(
    "tuneplane_celery_task_failures", "Celery tasks that raised, by task.", ["task"]
)

_scrape_collectors: list = []


def register_scrape_collector(collector) -> None:
    """A collector the web's /metrics reads at each scrape (an app's figures from the
    database: nodes by state, the queue), registered by its app's ready()."""
    if collector not in _scrape_collectors:
        _scrape_collectors.append(collector)


def multiprocess_dir() -> str:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")


def scrape_registry() -> CollectorRegistry:
    """What /metrics shows: every process's counters (added up across the directory when
    several processes share one), and the apps' figures read now."""
    if multiprocess_dir():
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = CollectorRegistry()
        registry.register(_Default())
    for collector in _scrape_collectors:
        registry.register(collector)
    return registry


class _Default:
    """The process's own registry, inside a registry of the view's own."""

    def collect(self):
        yield from REGISTRY.collect()


def scraper_allowed(authorization: str, address: str, *, token: str, allow) -> bool:
    """R23: metrics answer configured scrapers only — a request bearing ``token`` (when one
    is set), or one from an address in ``allow`` (networks). With neither configured, none:
    no process is trusted for being on this machine, as a tenant's member may be."""
    if token and hmac.compare_digest(authorization.encode(), f"Bearer {token}".encode()):
        return True
    try:
        client = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(client in network for network in allow)


def _configured_scraper(authorization: str, address: str) -> bool:
    return scraper_allowed(
        authorization,
        address,
        token=settings.TUNEPLANE_METRICS_TOKEN,
        allow=settings.TUNEPLANE_METRICS_ALLOW,
    )


NOT_PUBLIC = "metrics are not public\n"


def metrics_view(request):
    """The web's /metrics: the client's address as TUNEPLANE_TRUSTED_PROXIES tells it."""
    if not _configured_scraper(request.META.get("HTTP_AUTHORIZATION", ""), client_address(request)):
        return HttpResponse(NOT_PUBLIC, status=403, content_type="text/plain")
    return HttpResponse(generate_latest(scrape_registry()), content_type=CONTENT_TYPE_LATEST)


def scrapers_only(app):
    """A WSGI app answered for configured scrapers only (R23), as the web's /metrics is: the
    peer's own address, as no proxy stands before a gateway's or a worker's metrics port."""

    def guarded(environ, start_response):
        if not _configured_scraper(
            environ.get("HTTP_AUTHORIZATION", ""), environ.get("REMOTE_ADDR", "")
        ):
            start_response("403 Forbidden", [("Content-Type", "text/plain")])
            return [NOT_PUBLIC.encode()]
        return app(environ, start_response)

    return guarded


def serve_metrics_on(bind: str, registry=None):
    """Plain HTTP on ``bind`` (HOST:PORT), in a thread: a gateway's or a worker's metrics,
    for configured scrapers only (prometheus-client's own server, behind scrapers_only).
    Returns the server."""
    host, _, port = bind.rpartition(":")

    class Server(ThreadingWSGIServer):
        pass

    Server.address_family, addr = _get_best_family(host.strip("[]") or "127.0.0.1", int(port))
    app = scrapers_only(make_wsgi_app(registry or REGISTRY))
    server = make_server(addr, int(port), app, Server, handler_class=_SilentHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def task_started(task_id=None, task=None, **_) -> None:
    if task is not None:
        task.request.tuneplane_started = time.perf_counter()


def task_ended(task_id=None, task=None, **_) -> None:
    started = getattr(getattr(task, "request", None), "tuneplane_started", None)
    if started is not None:
        TASK_DURATION.labels(task.name).observe(time.perf_counter() - started)


def task_failed(sender=None, **_) -> None:
    TASK_FAILURES.labels(getattr(sender, "name", "unknown")).inc()


def worker_serving(**_) -> None:
    """A worker's own port (TUNEPLANE_WORKER_METRICS_BIND): its children's counters, which
    only a PROMETHEUS_MULTIPROC_DIR gathers."""
    if settings.TUNEPLANE_WORKER_METRICS_BIND:
        registry = CollectorRegistry()
        if multiprocess_dir():
            multiprocess.MultiProcessCollector(registry)
        else:
            registry.register(_Default())
        serve_metrics_on(settings.TUNEPLANE_WORKER_METRICS_BIND, registry)
