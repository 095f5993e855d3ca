"""Run the console's own commands as subprocesses against the test database."""

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from django.conf import settings
from django.db import connection

ROOT = Path(settings.BASE_DIR)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_url(name: str | None = None) -> str:
    db = connection.settings_dict
    if connection.vendor == "postgresql":
        user = db["USER"] or "postgres"
        host, port = db["HOST"] or "127.0.0.1", db["PORT"] or 5432
        return f"postgres://{user}@{host}:{port}/{name or db['NAME']}"
    return f"sqlite:///{name or db['NAME']}"


MAKE_ENV = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")


def console_env(var_dir: Path, **extra) -> dict:
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "TUNEPLANE_VAR_DIR": str(var_dir),
        "TUNEPLANE_DEBUG": "0",  # as `make run` (R23)
        "PYTHONUNBUFFERED": "1",
        **extra,
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    # A `make` a test runs (make token) is not inside the `make test` that ran pytest: its
    # command-line variables (make test DATABASE_URL=…) would override the test's own.
    for inherited in MAKE_ENV:
        env.pop(inherited, None)
    return env


def manage(*args, env: dict, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class Console:
    """``manage.py runconsole`` — what ``make run`` starts — with its output collected."""

    def __init__(self, env: dict, port: int, gateway_port: int | None = None):
        self.lines: list[str] = []
        self.env = env
        self.gateway = f"127.0.0.1:{gateway_port or free_port()}"
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "manage.py"),
                "runconsole",
                "--bind",
                f"127.0.0.1:{port}",
                "--gateway-bind",
                self.gateway,
            ],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    @property
    def logs(self) -> str:
        """What its processes wrote to their logs (var/log/NAME.log): the terminal has only
        their warnings."""
        folder, text = Path(self.env["TUNEPLANE_VAR_DIR"]) / "log", []
        for log in sorted(folder.glob("*.log")):
            try:
                text.append(log.read_text(errors="replace"))
            except FileNotFoundError:
                continue  # moved to NAME.log.1 as a new start began
        return "".join(text)

    def wait_for(self, text: str, timeout: float = 90) -> None:
        """Until ``text`` is on the terminal or in a process's log."""
        deadline = time.monotonic() + timeout
        while text not in self.output and text not in self.logs:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"never printed {text!r}:\n{self.output[-4000:]}")
            time.sleep(0.2)

    def stop(self, timeout: float = 30) -> int:
        self.process.send_signal(2)  # Ctrl-C
        code = self.process.wait(timeout)
        self._reader.join(5)
        return code


def processes_with_env(marker: str) -> list[int]:
    """PIDs of live processes whose environment contains ``marker``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker.encode() in (proc / "environ").read_bytes():
                status = (proc / "status").read_text()
                if "State:\tZ" not in status:
                    found.append(int(proc.name))
        except OSError:
            continue
    return found
