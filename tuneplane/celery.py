import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tuneplane.settings")

app = Celery("tuneplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Each task's runtime and failures, counted by Celery's own signals (tuneplane/metrics.py).
from celery.signals import task_failure, task_postrun, task_prerun, worker_init  # noqa: E402

from .metrics import task_ended, task_failed, task_started, worker_serving  # noqa: E402

task_prerun.connect(task_started, weak=False)
task_postrun.connect(task_ended, weak=False)
task_failure.connect(task_failed, weak=False)
worker_init.connect(worker_serving, weak=False)


# Beat stops between its ticks, never inside a query.
import faulthandler  # noqa: E402
import signal  # noqa: E402

from celery import platforms  # noqa: E402
from celery.signals import beat_init  # noqa: E402


def beat_stops_between_ticks(sender, **kwargs) -> None:
    """Celery's beat saves its schedule inside its SIGTERM handler. With the database
    scheduler that is a query run from a signal handler, and a SIGTERM that lands while beat's
    own query holds the connection: where connections are kept (TUNEPLANE_DB_CONN_MAX_AGE),
    the handler waits for good on the lock that query holds (psycopg's, not re-entrant), a
    beat only a kill stops; where they are not, it closes the connection under that query.
    Here SIGTERM and
    SIGINT only ask beat's loop to end; it ends after its current tick (at most the
    scheduler's max interval, 5 s) and saves its schedule then, outside any handler. SIGUSR1
    writes every thread's stack to its output (as the worker's does): where a beat that does
    not stop is waiting."""

    def stop(signum, frame) -> None:
        sender.stop()

    platforms.signals.update(SIGTERM=stop, SIGINT=stop)
    faulthandler.register(signal.SIGUSR1, all_threads=True)


beat_init.connect(beat_stops_between_ticks, weak=False)
