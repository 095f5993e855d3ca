"""``manage.py runconsole`` (``make run``) before it starts anything: the web's port comes from
``--port`` or ``$PORT`` and the URLs agents are given follow it; a port already taken is
refused, naming it and what to do; the first admin password is kept in ``var/`` (0600)."""

import os
import socket
import stat
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from tuneplane.management.commands import runconsole

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def taken():
    """A port something else listens on, as another server on 8000 would."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def child_env(var_dir: Path, **extra) -> dict:
    """What a console process reads: no test database, a var dir of its own."""
    env = {**os.environ, "TUNEPLANE_VAR_DIR": str(var_dir), "PYTHONUNBUFFERED": "1", **extra}
    for name in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL", "PORT"):
        env.pop(name, None)
    env.update(extra)
    return env


# -- a taken port --------------------------------------------------------------------


def test_a_taken_web_port_from_PORT_is_refused_at_once_naming_it(taken, tmp_path):
    started = time.monotonic()
    refused = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "runconsole"],
        env=child_env(tmp_path, PORT=str(taken)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0
    assert time.monotonic() - started < 30
    assert f"Port {taken} is already in use" in refused.stderr, refused.stderr
    assert f"127.0.0.1:{taken}" in refused.stderr
    assert f"make run PORT={taken + 1}" in refused.stderr
    assert "console is up" not in refused.stdout and "Traceback" not in refused.stderr
    # Refused before anything was made: no database, no admin, no CA.
    assert not (tmp_path / "tuneplane.sqlite3").exists()
    assert not (tmp_path / "admin-password").exists() and not (tmp_path / "pki").exists()


def test_a_taken_web_port_from_the_port_option_is_refused(taken, db):
    with pytest.raises(CommandError) as refused:
        call_command(
            "runconsole", "--port", str(taken), "--gateway-bind", f"127.0.0.1:{free_port()}"
        )
    assert str(refused.value).startswith(f"Port {taken} is already in use, so the web")


def test_a_taken_gateway_port_is_refused_naming_the_gateway(taken, db):
    with pytest.raises(CommandError) as refused:
        call_command(
            "runconsole", "--port", str(free_port()), "--gateway-bind", f"127.0.0.1:{taken}"
        )
    message = str(refused.value)
    assert message.startswith(f"Port {taken} is already in use, so the gRPC gateway")
    assert "TUNEPLANE_GATEWAY_BIND" in message


def stop_before_migrating(*args, **kwargs):
    raise SystemExit("went on to start")


def test_a_taken_gateway_metrics_port_is_only_a_warning(taken, db, monkeypatch):
    """The gateway serves without its metrics (grpcserve logs and goes on): no gate."""
    started = []
    monkeypatch.setattr(
        runconsole.Command, "_point_agents_here", lambda *args: started.append(args)
    )
    monkeypatch.setattr(runconsole, "call_command", stop_before_migrating)
    err = StringIO()
    with pytest.raises(SystemExit, match="went on to start"):
        call_command(
            "runconsole",
            "--port",
            str(free_port()),
            "--gateway-bind",
            f"127.0.0.1:{free_port()}",
            "--gateway-metrics-bind",
            f"127.0.0.1:{taken}",
            stderr=err,
        )
    assert f"Port {taken} is already in use: the gateway's metrics will not be served" in (
        err.getvalue()
    )
    assert started


def test_a_port_only_in_TIME_WAIT_or_free_is_not_taken():
    assert not runconsole.port_in_use(f"127.0.0.1:{free_port()}", option="--bind")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--port", "8001", "--bind", "127.0.0.1:8002"], "--port and --bind: give one"),
        (["--bind", "127.0.0.1"], "--bind: '127.0.0.1' is not HOST:PORT"),
        (["--bind", "127.0.0.1:70000"], "--bind: '127.0.0.1:70000' is not HOST:PORT"),
    ],
)
def test_a_bad_port_is_refused_naming_the_option(arguments, message, db):
    with pytest.raises(CommandError, match=message):
        call_command("runconsole", *arguments)


def test_a_bad_PORT_is_refused_naming_it(monkeypatch, db):
    monkeypatch.setenv("PORT", "eighty")
    with pytest.raises(CommandError, match="PORT: 'eighty' is not a port number"):
        call_command("runconsole")


# -- the URLs agents are given ------------------------------------------------------


def test_the_url_agents_and_install_sh_are_given_follows_the_port(monkeypatch, tmp_path):
    for name in ("TUNEPLANE_PUBLIC_URL", "TUNEPLANE_GATEWAY_TARGET"):
        monkeypatch.delenv(name, raising=False)
    runconsole.Command()._point_agents_here("127.0.0.1:8123", "0.0.0.0:8543")
    assert os.environ["TUNEPLANE_PUBLIC_URL"] == "http://127.0.0.1:8123"
    assert os.environ["TUNEPLANE_GATEWAY_TARGET"] == "127.0.0.1:8543"
    # What the web it starts then tells agents: the one-liner and the join command.
    said = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "shell", "-c",
         "from nodes.services.join import join_commands; "
         "print(*(f'said: {c}' for c in join_commands('gpu-lab', 'tpj_x').values()), sep='\\n')"],
        env=child_env(tmp_path, TUNEPLANE_PUBLIC_URL=os.environ["TUNEPLANE_PUBLIC_URL"]),
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert said.returncode == 0, said.stderr
    install, join = [line for line in said.stdout.splitlines() if line.startswith("said: ")]
    assert install.startswith("said: curl -fsSL http://127.0.0.1:8123/install.sh | ")
    assert "--server http://127.0.0.1:8123 " in join


def test_an_operators_public_url_is_kept(monkeypatch):
    monkeypatch.setenv("TUNEPLANE_PUBLIC_URL", "https://tuneplane.corp")
    monkeypatch.setenv("TUNEPLANE_GATEWAY_TARGET", "gateway.corp:443")
    runconsole.Command()._point_agents_here("0.0.0.0:8001", "0.0.0.0:8443")
    assert os.environ["TUNEPLANE_PUBLIC_URL"] == "https://tuneplane.corp"
    assert os.environ["TUNEPLANE_GATEWAY_TARGET"] == "gateway.corp:443"


def test_a_wildcard_bind_gives_agents_loopback():
    assert runconsole.public_url("0.0.0.0:8001") == "http://127.0.0.1:8001"
    assert runconsole.public_url("[::1]:8001") == "http://[::1]:8001"


# -- the admin password ----------------------------------------------------------------


def ensure_admin() -> str:
    out = StringIO()
    command = runconsole.Command(stdout=out)
    command._ensure_admin()
    return out.getvalue()


def test_the_first_admin_password_is_printed_and_kept_in_var_0600(settings, tmp_path, db):
    settings.VAR_DIR = tmp_path / "var"
    said = ensure_admin()
    kept = tmp_path / "var" / "admin-password"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    password = kept.read_text().strip()
    assert kept.read_text() == password + "\n" and len(password) >= 16
    assert f"username admin  password {password}  (also kept in {kept}, mode 0600)" in said
    assert get_user_model().objects.get(username="admin").check_password(password)
    # The next start makes no new admin and leaves the file as it was.
    again = ensure_admin()
    assert "existing superuser" in again and str(kept) in again and password not in again
    assert kept.read_text() == password + "\n"
    assert get_user_model().objects.filter(is_superuser=True).count() == 1


def test_a_kept_password_file_left_readable_is_made_0600_again(settings, tmp_path, db):
    settings.VAR_DIR = tmp_path
    stale = tmp_path / "admin-password"
    stale.write_text("an old password\n")
    stale.chmod(0o644)
    ensure_admin()
    assert stat.S_IMODE(stale.stat().st_mode) == 0o600
    assert get_user_model().objects.get(username="admin").check_password(stale.read_text().strip())


# -- var/ and metrics are the console's own (R23) ---------------------------------------


def test_R23_var_is_made_0600_files_in_0700_dirs_and_links_are_not_followed(tmp_path):
    var = tmp_path / "var"
    (var / "pki").mkdir(parents=True)
    (var / "broker" / "queue").mkdir(parents=True)
    for path in (var / "tuneplane.sqlite3", var / "pki" / "ca.key", var / "broker" / "queue" / "m"):
        path.write_text("x")
        path.chmod(0o644)
    for directory in (var, var / "pki", var / "broker", var / "broker" / "queue"):
        directory.chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("not the console's")
    elsewhere.chmod(0o644)
    (var / "link").symlink_to(elsewhere)

    runconsole.var_private(var)

    for path in [var, *var.rglob("*")]:
        if path.is_symlink():
            continue
        want = 0o700 if path.is_dir() else 0o600
        assert stat.S_IMODE(path.stat().st_mode) == want, path
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o644  # never followed
    fresh = tmp_path / "new"
    runconsole.var_private(fresh)  # none yet: made so
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700


def test_R23_make_run_scrapes_metrics_with_a_token_of_its_own_kept_0600(
    settings, tmp_path, monkeypatch
):
    settings.VAR_DIR = tmp_path
    monkeypatch.delenv("TUNEPLANE_METRICS_TOKEN", raising=False)
    kept = runconsole.Command()._scrape_token()
    token = os.environ["TUNEPLANE_METRICS_TOKEN"]
    assert kept == tmp_path / "metrics-token" and kept.read_text() == token + "\n"
    assert len(token) >= 32 and stat.S_IMODE(kept.stat().st_mode) == 0o600
    monkeypatch.delenv("TUNEPLANE_METRICS_TOKEN")
    runconsole.Command()._scrape_token()
    assert os.environ["TUNEPLANE_METRICS_TOKEN"] == token  # the same across starts
    # An operator's own token is kept, and nothing is written.
    monkeypatch.setenv("TUNEPLANE_METRICS_TOKEN", "operators")
    kept.unlink()
    assert runconsole.Command()._scrape_token() is None and not kept.exists()


def test_R23_make_run_and_make_token_are_not_in_debug_mode_unless_asked():
    recipes = [
        line for line in (ROOT / "Makefile").read_text().splitlines() if "TUNEPLANE_DEBUG" in line
    ]
    assert len(recipes) == 2
    assert all("${TUNEPLANE_DEBUG:-0}" in line for line in recipes), recipes
