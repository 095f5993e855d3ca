"""`celery -A tuneplane worker` and `beat` start and answer over a real Redis."""

import subprocess
import sys
import time
import uuid

import pytest

from tests.e2e.console import ROOT, console_env
from tuneplane.celery import app

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.django_db(transaction=True)]


def start(args, env):
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tuneplane", *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_worker_answers_a_ping_over_redis(require_redis, tmp_path):
    assert app.conf.broker_url == require_redis
    name = f"test-{uuid.uuid4().hex[:8]}@localhost"
    worker = start(
        ["worker", "-l", "INFO", "--pool", "solo", "-n", name],
        console_env(tmp_path, REDIS_URL=require_redis),
    )
    try:
        deadline = time.monotonic() + 60
        replies = []
        while not replies and time.monotonic() < deadline and worker.poll() is None:
            replies = app.control.ping(destination=[name], timeout=1)
        assert replies and name in replies[0], replies
    finally:
        worker.terminate()
        output = worker.communicate(timeout=30)[0]
    assert "redis://" in output


def test_beat_starts_on_the_database_scheduler(require_redis, tmp_path):
    beat = start(["beat", "-l", "INFO"], console_env(tmp_path, REDIS_URL=require_redis))
    lines = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = beat.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "beat: Starting" in line:
                break
    finally:
        beat.terminate()
        beat.wait(30)
    output = "".join(lines)
    assert "beat: Starting" in output, output
    assert "django_celery_beat.schedulers.DatabaseScheduler" in output
