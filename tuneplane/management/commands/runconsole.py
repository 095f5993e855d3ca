"""``make run``: the whole console on one machine — web, gateway, Celery worker and beat —
kept running (a process that dies is started again, tuneplane.supervisor), its processes'
output in ``var/log/``, stopped together on Ctrl-C or SIGTERM."""

import os
import secrets
import shutil
import signal
import socket
import sys
import time
import urllib.request
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from tuneplane.supervisor import LOG_DIR, Supervisor

ADMIN_USERNAME = "admin"
ADMIN_PASSWORD_FILE = "admin-password"
METRICS_TOKEN_FILE = "metrics-token"
DEFAULT_GATEWAY_METRICS = "127.0.0.1:9464"
DEFAULT_PORT = 8000
STOP_GRACE_SECONDS = 10
# A wildcard bind listens everywhere; agents on this machine reach it on loopback.
WILDCARD_HOSTS = {"0.0.0.0", "::", ""}


def split_bind(bind: str, *, option: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8000`` for IPv6) as its host and port, or an error naming
    ``option``."""
    host, _, port = bind.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise CommandError(f"{option}: {bind!r} is not HOST:PORT with a port from 1 to 65535.")
    return host.strip("[]"), int(port)


def port_in_use(bind: str, *, option: str) -> bool:
    """Whether something already listens where ``bind`` would: checked by binding there,
    not by asking over HTTP (a probe answered by another server reads as ours)."""
    host, port = split_bind(bind, option=option)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As the servers themselves bind: a port left in TIME_WAIT is free, a listener is not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host or "0.0.0.0", port))
        except OSError:
            return True
    return False


def public_url(bind: str) -> str:
    """The URL agents and the install one-liner are given for a web bound at ``bind``."""
    host, port = split_bind(bind, option="--bind")
    host = "127.0.0.1" if host in WILDCARD_HOSTS else host
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def admin_password_path() -> Path:
    return Path(settings.VAR_DIR) / ADMIN_PASSWORD_FILE


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only, from the first byte: made 0600
    when new, set back to 0600 when it was not."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        os.fchmod(file.fileno(), 0o600)
        file.write(text)


def var_private(directory: Path) -> None:
    """R23: the embedded console's own parts — its SQLite file, CA key, admin password,
    broker, metrics token and counters — for the console's user only: ``directory`` and every
    directory in it 0700, every file 0600. A symbolic link is left as it is, never followed."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    for root, directories, files in os.walk(directory):
        for name, mode in [(d, 0o700) for d in directories] + [(f, 0o600) for f in files]:
            path = Path(root) / name
            if not path.is_symlink():
                path.chmod(mode)


def default_port() -> int:
    value = os.environ.get("PORT", str(DEFAULT_PORT))
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise CommandError(f"PORT: {value!r} is not a port number from 1 to 65535.")
    return int(value)


class Command(BaseCommand):
    help = "Migrate, make the first admin login, then run web, gateway, worker and beat."

    def add_arguments(self, parser):
        parser.add_argument(
            "--port",
            type=int,
            help=f"The web's port on 127.0.0.1 (default: $PORT, else {DEFAULT_PORT}). The URL "
            "agents and install.sh are given (TUNEPLANE_PUBLIC_URL) follows it unless set.",
        )
        parser.add_argument(
            "--bind", help="HOST:PORT for the web, instead of --port (default 127.0.0.1:PORT)."
        )
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

    def handle(self, *args, port, bind, gateway_bind, gateway_metrics_bind, **options):
        if bind is None:
            bind = f"127.0.0.1:{default_port() if port is None else port}"
        elif port is not None:
            raise CommandError("--port and --bind: give one (--bind carries its own port).")
        self._refuse_taken_ports(bind, gateway_bind, gateway_metrics_bind)
        self._point_agents_here(bind, gateway_bind)
        call_command("migrate", interactive=False, verbosity=0)
        # What this command and its children make from here on is theirs alone (R23); what
        # was made before (the SQLite file, a var/ of an older start) is made so now.
        os.umask(0o077)
        var_private(Path(settings.VAR_DIR))
        call_command("pki", "init")
        self._ensure_agent_wheels()
        self._ensure_admin()
        scrape_token = self._scrape_token()
        var_private(Path(settings.VAR_DIR))
        manage = str(Path(settings.BASE_DIR) / "manage.py")
        celery = [sys.executable, "-m", "celery", "-A", "tuneplane"]
        self._share_metrics()
        gateway = ["grpcserve", "--bind", gateway_bind, "--metrics-bind", gateway_metrics_bind]
        # Never in debug mode unless asked (R23): runserver then serves the admin's static
        # files only when told to (--insecure); the embedded console has no other server.
        processes = {
            "web": [sys.executable, manage, "runserver", bind, "--noreload", "--insecure"],
            "gateway": [sys.executable, manage, *gateway],
            "worker": celery + ["worker", "-l", "INFO", "--concurrency", "2"],
            "beat": celery + ["beat", "-l", "INFO"],
        }
        # The banner says what the web is; runserver need not say it again at each start.
        os.environ.setdefault("DJANGO_RUNSERVER_HIDE_WARNING", "true")
        stopping = False

        def stop(signum, frame):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        log_dir = Path(settings.VAR_DIR) / LOG_DIR
        supervisor = Supervisor(processes, log_dir=log_dir, say=self.stdout.write)
        supervisor.start_all()
        bearer = f" with Authorization: Bearer $(cat {scrape_token})" if scrape_token else ""
        metrics = (
            f"  metrics  {public_url(bind)}/metrics (web, worker, beat), "
            f"http://{gateway_metrics_bind}/metrics (gateway){bearer}\n"
            f"  logs     {log_dir}/{{{','.join(processes)}}}.log (the terminal shows "
            "warnings and errors)"
        )
        announced, waiting_since, warned = False, time.monotonic(), False
        while not stopping:
            supervisor.check()
            if not announced and self._healthy(bind):
                self._announce(bind, gateway_bind)
                self.stdout.write(metrics)
                announced = True
            elif not announced and not warned and time.monotonic() - waiting_since > 60:
                self.stderr.write(
                    f"The web has not answered {public_url(bind)}/healthz for a minute; "
                    f"its log: {log_dir / 'web.log'}."
                )
                warned = True
            time.sleep(0.5)
        for name in supervisor.stop(STOP_GRACE_SECONDS):
            self.stderr.write(f"{name} did not stop in {STOP_GRACE_SECONDS}s; killed it.")
        self.stdout.write("Stopped.")

    def _refuse_taken_ports(self, bind: str, gateway_bind: str, metrics_bind: str) -> None:
        """Start nothing when the web's or the gateway's port is taken: the web would fail
        behind a health probe that another server answers, the gateway with a traceback.
        The gateway's metrics are no gate (it serves without them): a warning."""
        next_port = split_bind(bind, option="--bind")[1] + 1
        for option, where, what, what_to_do in (
            (
                "--bind",
                bind,
                "the web (admin, API, install.sh)",
                f"start on another port: `make run PORT={next_port}` "
                f"(manage.py runconsole --port {next_port})",
            ),
            (
                "--gateway-bind",
                gateway_bind,
                "the gRPC gateway",
                "move the gateway: TUNEPLANE_GATEWAY_BIND=127.0.0.1:N (manage.py runconsole "
                "--gateway-bind 127.0.0.1:N); agents are given it",
            ),
        ):
            if port_in_use(where, option=option):
                port = split_bind(where, option=option)[1]
                raise CommandError(
                    f"Port {port} is already in use, so {what} cannot listen on {where}. "
                    f"Stop what holds it (`ss -ltnp 'sport = :{port}'` names it), or "
                    f"{what_to_do}."
                )
        if port_in_use(metrics_bind, option="--gateway-metrics-bind"):
            self.stderr.write(
                f"Port {split_bind(metrics_bind, option='--gateway-metrics-bind')[1]} is "
                f"already in use: the gateway's metrics will not be served on {metrics_bind} "
                "(set TUNEPLANE_GATEWAY_METRICS_BIND=127.0.0.1:N to move them)."
            )

    def _point_agents_here(self, bind: str, gateway_bind: str) -> None:
        """The web, worker and beat read their settings from this environment: what agents
        and the install one-liner are told follows where the web and gateway listen, unless
        an operator said otherwise."""
        os.environ.setdefault("TUNEPLANE_PUBLIC_URL", public_url(bind))
        host, port = split_bind(gateway_bind, option="--gateway-bind")
        host = "127.0.0.1" if host in WILDCARD_HOSTS else host
        os.environ.setdefault(
            "TUNEPLANE_GATEWAY_TARGET", f"{f'[{host}]' if ':' in host else host}:{port}"
        )

    def _scrape_token(self) -> Path | None:
        """R23: metrics answer configured scrapers only. Unless an operator set
        TUNEPLANE_METRICS_TOKEN, the web, gateway and worker are given one kept in var/
        (0600, the same across starts): where it is, for the announcement."""
        if os.environ.get("TUNEPLANE_METRICS_TOKEN"):
            return None
        kept = Path(settings.VAR_DIR) / METRICS_TOKEN_FILE
        token = kept.read_text().strip() if kept.exists() else ""
        if not token:
            token = secrets.token_urlsafe(32)
            write_private(kept, token + "\n")
        os.environ["TUNEPLANE_METRICS_TOKEN"] = token
        return kept

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
        kept = admin_password_path()
        if users.filter(is_superuser=True).exists():
            where = f" (its first password, if unchanged: {kept})" if kept.exists() else ""
            self.stdout.write(
                f"Admin login: the existing superuser{where}; reset a password with "
                f"`.venv/bin/python manage.py changepassword {ADMIN_USERNAME}`."
            )
            return
        password = secrets.token_urlsafe(12)
        users.create_superuser(ADMIN_USERNAME, "", password)
        write_private(kept, password + "\n")
        self.stdout.write(
            self.style.SUCCESS(
                f"Admin login, shown this once: username {ADMIN_USERNAME}  password {password}  "
                f"(also kept in {kept}, mode 0600)"
            )
        )

    @staticmethod
    def _healthy(bind: str) -> bool:
        try:
            with urllib.request.urlopen(f"{public_url(bind)}/healthz", timeout=1):
                return True
        except OSError:
            return False

    def _announce(self, bind: str, gateway_bind: str) -> None:
        base = public_url(bind)
        self.stdout.write(
            f"\nTuneplane console is up (database: {settings.DATABASES['default']['ENGINE']}, "
            f"broker: {settings.CELERY_BROKER_URL.split('@')[-1]})\n"
            f"  admin    {base}/admin/\n"
            f"  API      {base}/api/fleets\n"
            f"  API docs {base}/api/docs\n"
            f"  health   {base}/healthz\n"
            f"  gateway  {gateway_bind} (gRPC, mutual TLS)\n"
            f"  agents   are given {os.environ['TUNEPLANE_PUBLIC_URL']} and "
            f"{os.environ['TUNEPLANE_GATEWAY_TARGET']} (TUNEPLANE_PUBLIC_URL, "
            "TUNEPLANE_GATEWAY_TARGET)\n"
            f"  token    make token USER={ADMIN_USERNAME}  (an API token, printed once)\n"
            "A process that dies is started again; Ctrl-C stops web, gateway, worker and beat."
        )
