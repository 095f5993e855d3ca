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
