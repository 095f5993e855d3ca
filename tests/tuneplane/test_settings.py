"""Settings come from the environment with the product's defaults."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.console import ROOT

SHOW = (
    "import json; from django.conf import settings as s; import django; django.setup(); "
    "from tuneplane.celery import app; "
    "print(json.dumps({'engine': s.DATABASES['default']['ENGINE'], "
    "'name': str(s.DATABASES['default']['NAME']), 'broker': s.CELERY_BROKER_URL, "
    "'ttl': s.TUNEPLANE_JOIN_TOKEN_TTL, 'fresh': s.TUNEPLANE_PLACEMENT_FRESHNESS, "
    "'train': s.TUNEPLANE_QUIET_TRAIN, 'serve': s.TUNEPLANE_QUIET_SERVE, "
    "'env': s.TUNEPLANE_QUIET_ENV, 'min_runtime': s.TUNEPLANE_PREEMPT_MIN_RUNTIME, "
    "'remote_control': app.conf.worker_enable_remote_control}))"
)

# Each test starts a Python process that loads the settings.
pytestmark = pytest.mark.e2e


def settings_under(tmp_path, **env):
    base = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "tuneplane.settings",
        "TUNEPLANE_VAR_DIR": str(tmp_path),
    }
    return subprocess.run(
        [sys.executable, "-c", SHOW], cwd=ROOT, env={**base, **env}, capture_output=True, text=True
    )


def test_embedded_defaults_are_sqlite_and_a_filesystem_broker(tmp_path):
    shown = json.loads(settings_under(tmp_path).stdout)
    assert shown["engine"] == "django.db.backends.sqlite3"
    assert shown["name"] == str(tmp_path / "tuneplane.sqlite3")
    assert shown["broker"] == "tuneplane-filesystem://"  # kombu's folder broker, atomic writes
    assert (shown["ttl"], shown["fresh"], shown["train"], shown["serve"], shown["env"]) == (
        86400,
        45,
        300,
        45,
        45,
    )
    assert (tmp_path / "broker" / "queue").is_dir()
    # The folder broker's busiest writers, the remote control's broadcasts, are off (issue 49).
    assert shown["remote_control"] is False


def test_urls_move_it_onto_postgresql_and_redis(tmp_path):
    shown = json.loads(
        settings_under(
            tmp_path,
            DATABASE_URL="postgres://tp:secret@db.internal:6543/console",
            REDIS_URL="redis://cache.internal:6380/2",
        ).stdout
    )
    assert shown["engine"] == "django.db.backends.postgresql" and shown["name"] == "console"
    assert shown["broker"] == "redis://cache.internal:6380/2"
    assert shown["remote_control"] is True  # Celery's own default on a real broker


def test_durations_are_whole_seconds_and_tests_can_shorten_them(tmp_path):
    shown = json.loads(
        settings_under(tmp_path, TUNEPLANE_QUIET_SERVE="3", TUNEPLANE_QUIET_TRAIN="7").stdout
    )
    assert (shown["serve"], shown["train"]) == (3, 7)


@pytest.mark.parametrize("value", ["45s", "-1", "0", "1.5"])
def test_a_bad_duration_is_refused_naming_the_setting(tmp_path, value):
    result = settings_under(tmp_path, TUNEPLANE_QUIET_SERVE=value)
    assert result.returncode != 0
    assert "TUNEPLANE_QUIET_SERVE" in result.stderr and "ImproperlyConfigured" in result.stderr


def test_issue17_item14_behind_tls_check_deploy_is_clean(tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "tuneplane.settings",
        "TUNEPLANE_VAR_DIR": str(tmp_path),
        "TUNEPLANE_HTTPS": "1",
    }
    checked = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stderr
    assert "System check identified no issues" in checked.stdout
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings as s; "
            "print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, "
            "s.SECURE_HSTS_SECONDS > 0, s.SECURE_PROXY_SSL_HEADER)",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert shown.stdout.split() == ["True"] * 4 + ["('HTTP_X_FORWARDED_PROTO',", "'https')"]


def test_a_key_another_process_wrote_first_is_read_not_refused(tmp_path, monkeypatch):
    """`make run` starts the web, the gateway, the worker and beat at once: one that found
    no key and then lost the race to write it reads the winner's, rather than failing on
    the file the winner made (seen as a gateway's FileExistsError at start)."""
    from tuneplane import settings as module

    (tmp_path / "secret_key").write_text("written-by-the-web")
    monkeypatch.setattr(module, "VAR_DIR", tmp_path)
    monkeypatch.delenv("TUNEPLANE_SECRET_KEY", raising=False)
    monkeypatch.setattr(Path, "exists", lambda path: False)  # not there when it looked
    assert module._secret_key() == "written-by-the-web"
    assert [path.name for path in tmp_path.iterdir()] == ["secret_key"]  # none of its own left


def test_Q5_a_minimum_runtime_of_none_at_all_is_a_setting_a_negative_one_is_not(tmp_path):
    shown = json.loads(settings_under(tmp_path, TUNEPLANE_PREEMPT_MIN_RUNTIME="0").stdout)
    assert shown["min_runtime"] == 0
    refused = settings_under(tmp_path, TUNEPLANE_PREEMPT_MIN_RUNTIME="-1")
    assert refused.returncode != 0 and "TUNEPLANE_PREEMPT_MIN_RUNTIME" in refused.stderr
    assert "at least 0" in refused.stderr
