"""``make run``: the whole console on one machine, stopped together on Ctrl-C."""

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

ADMIN_USERNAME = "admin"
DEFAULT_GATEWAY_METRICS = "127.0.0.1:9464"
STOP_GRACE_SECONDS = 10


class Command(BaseCommand):
    help = "Migrate, make the first admin login, then run web, gateway, worker and beat."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default="127.0.0.1:8000", help="HOST:PORT for the web.")
        parser.add_argument(
            "--gateway-bind",
            default=settings.TUNEPLANE_GATEWAY_BIND,
            help="HOST:PORT for the gRPC gateway (TUNEPLANE_GATEWAY_BIND).",
        )
        parser.add_argument(
            "--gateway-metrics-bind",
            default=settings.TUNEPLANE_GATEWAY_METRICS_BIND or DEFAULT_GATEWAY_METRICS,
            help="HOST:PORT for the gateway's Prometheus metrics (TUNEPLANE_GATEWAY_METRICS_BIND).",
        )

    def handle(self, *args, bind, gateway_bind, gateway_metrics_bind, **options):
        call_command("migrate", interactive=False, verbosity=0)
        call_command("pki", "init")
        self._ensure_agent_wheels()
        self._ensure_admin()
        manage = str(Path(settings.BASE_DIR) / "manage.py")
        celery = [sys.executable, "-m", "celery", "-A", "tuneplane"]
        self._share_metrics()
        gateway = ["grpcserve", "--bind", gateway_bind, "--metrics-bind", gateway_metrics_bind]
        processes = {
            "web": [sys.executable, manage, "runserver", bind, "--noreload"],
            "gateway": [sys.executable, manage, *gateway],
            "worker": celery + ["worker", "-l", "INFO", "--concurrency", "2"],
            "beat": celery + ["beat", "-l", "INFO"],
        }
        children = {
            name: subprocess.Popen(command, start_new_session=True)
            for name, command in processes.items()
        }
        stopping = False

        def stop(signum, frame):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        self._announce(bind, gateway_bind, children)
        self.stdout.write(
            f"  metrics  {f'http://{bind}'}/metrics (web, worker, beat), "
            f"http://{gateway_metrics_bind}/metrics (gateway)\n"
        )
        exit_code = 0
        while not stopping:
            for name, child in children.items():
                if child.poll() is not None:
                    self.stderr.write(f"{name} exited with {child.returncode}; stopping the rest.")
                    stopping, exit_code = True, 1
                    break
            time.sleep(0.5)
        self._stop(children)
        sys.exit(exit_code)

    def _share_metrics(self) -> None:
        """The web, the worker's children and beat count into one directory the web's
        /metrics adds up (prometheus-client's multiprocess mode), emptied at each start."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            return
        directory = Path(settings.VAR_DIR) / "prometheus"
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)

    def _ensure_agent_wheels(self) -> None:
        """install.sh installs the agent from the console itself; build it once."""
        try:
            call_command("build_agent", "--if-missing")
        except CommandError as exc:
            self.stderr.write(
                f"install.sh will fail until `python manage.py build_agent` succeeds: {exc}"
            )

    def _ensure_admin(self) -> None:
        users = get_user_model().objects
        if users.filter(is_superuser=True).exists():
            self.stdout.write(
                f"Admin login: the existing superuser (reset a password with "
                f"`.venv/bin/python manage.py changepassword {ADMIN_USERNAME}`)."
            )
            return
        password = secrets.token_urlsafe(12)
        users.create_superuser(ADMIN_USERNAME, "", password)
        self.stdout.write(
            self.style.SUCCESS(
                f"Admin login, shown this once: username {ADMIN_USERNAME}  password {password}"
            )
        )

    def _announce(self, bind: str, gateway_bind: str, children: dict) -> None:
        base = f"http://{bind}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and children["web"].poll() is None:
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=1):
                    break
            except OSError:
                time.sleep(0.3)
        self.stdout.write(
            f"\nTuneplane console is up (database: {settings.DATABASES['default']['ENGINE']}, "
            f"broker: {settings.CELERY_BROKER_URL.split('@')[-1]})\n"
            f"  admin    {base}/admin/\n"
            f"  API      {base}/api/fleets\n"
            f"  API docs {base}/api/docs\n"
            f"  health   {base}/healthz\n"
            f"  gateway  {gateway_bind} (gRPC, mutual TLS)\n"
            f"  token    make token USER={ADMIN_USERNAME}  (an API token, printed once)\n"
            "Ctrl-C stops web, gateway, worker and beat.\n"
        )

    def _stop(self, children: dict) -> None:
        for child in children.values():
            if child.poll() is None:
                child.terminate()
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for name, child in children.items():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stderr.write(f"{name} did not stop in {STOP_GRACE_SECONDS}s; killing it.")
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        self.stdout.write("Stopped.")
