"""``make run``'s supervisor (tuneplane.supervisor): the restart backoff, how an exit is named
and which lines of a process's output reach the terminal are decisions tested as data; the
supervisor itself on small processes of its own (sh, sleep), not the console's."""

import os
import signal
import stat
import sys
import time
from pathlib import Path

import pytest

from tuneplane.supervisor import Backoff, Supervisor, duration, exit_reason, shown

# -- the backoff, without processes ------------------------------------------------------------


@pytest.mark.parametrize(
    ("previous", "uptime", "delay"),
    [
        (None, 0.0, 1.0),  # the first death: a second
        (1.0, 0.5, 2.0),  # died again soon: twice as long
        (2.0, 3.0, 4.0),
        (16.0, 10.0, 32.0),
        (32.0, 10.0, 60.0),  # up to a minute ...
        (60.0, 1.0, 60.0),  # ... and no longer
        (60.0, 59.9, 60.0),  # up not quite a minute: still crashing
        (60.0, 60.0, 1.0),  # up a minute: a crash now and then starts over
        (8.0, 3600.0, 1.0),
    ],
)
def test_a_dead_process_waits_1s_doubling_to_60s_reset_once_it_stayed_up(previous, uptime, delay):
    assert Backoff().delay(previous=previous, uptime=uptime) == delay


def test_a_process_that_never_starts_is_tried_once_a_minute_not_in_a_loop():
    backoff, delay, waits = Backoff(), None, []
    for _ in range(10):
        delay = backoff.delay(previous=delay, uptime=0.2)
        waits.append(delay)
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60, 60]


@pytest.mark.parametrize(
    ("returncode", "said"),
    [
        (0, "exited with 0"),
        (1, "exited with 1"),
        (-signal.SIGKILL, "was killed by SIGKILL"),
        (-signal.SIGSEGV, "was killed by SIGSEGV"),
        (-200, "was killed by signal 200"),
    ],
)
def test_an_exit_is_named_by_its_code_or_signal(returncode, said):
    assert exit_reason(returncode) == said


@pytest.mark.parametrize(
    ("seconds", "said"), [(0.4, "0s"), (59, "59s"), (61, "1m01s"), (3725, "1h02m")]
)
def test_durations_read_as_a_person_says_them(seconds, said):
    assert duration(seconds) == said


# -- what the terminal shows, without processes ------------------------------------------------

CELERY_INFO = "[2026-12-07 19:18:45,717: INFO/MainProcess] Task nodes.liveness_sweep[e6] received"
CELERY_TASK_INFO = (
    "[2026-12-07 19:18:45,717: INFO/ForkPoolWorker-1] Task nodes.liveness_sweep[e6] succeeded"
)
CELERY_WARNING = "[2026-12-07 19:18:40,123: WARNING/MainProcess] consumer: Connection lost"
CELERY_ERROR = "[2026-12-07 19:18:45,717: ERROR/ForkPoolWorker-1] Task x[e6] raised unexpected"
CELERY_CRITICAL = (
    "[2026-12-07 19:20:01,002: CRITICAL/MainProcess] Unrecoverable error: JSONDecodeError()"
)
CONSOLE_INFO = "2026-12-07 19:18:39,700 INFO nodes.gateway stream opened for node 3"
CONSOLE_WARNING = "2026-12-07 19:18:39,700 WARNING tuneplane.clusters Slurm did not answer"
CONSOLE_ERROR = "2026-12-07 19:18:39,700 ERROR django.request Internal Server Error: /api/x"
CLIENT_404 = '2026-12-07 19:18:39,700 WARNING django.server "GET /nope HTTP/1.1" 404 179'
CLIENT_NOT_FOUND = "2026-12-07 19:18:39,700 WARNING django.request Not Found: /nope"
KOMBU_NO_HOST = (
    "2026-12-07 19:18:39,700 WARNING kombu.connection No hostname was supplied. "
    "Reverting to default 'localhost'"
)


@pytest.mark.parametrize(
    ("line", "show"),
    [
        (CELERY_INFO, False),
        (CELERY_TASK_INFO, False),
        (CONSOLE_INFO, False),
        ("[2026-12-07 19:18:45,717: DEBUG/MainProcess] polling", False),
        (" -------------- celery@host v5.5.3 (immunity)", False),  # the worker's banner
        ("    . broker -> tuneplane-filesystem://:**@localhost//", False),
        ("Starting development server at http://127.0.0.1:8000/", False),  # runserver's
        ('[07/Dec/2026 19:18:40] "GET /healthz HTTP/1.1" 200 34', False),
        (CELERY_WARNING, True),
        (CELERY_ERROR, True),
        (CELERY_CRITICAL, True),
        (CONSOLE_WARNING, True),
        (CONSOLE_ERROR, True),
        (CLIENT_404, False),  # a client's answer, not the operator's news
        (CLIENT_NOT_FOUND, False),
        (KOMBU_NO_HOST, False),  # at every start on the embedded broker
        ("Traceback (most recent call last):", True),  # a crash outside logging
        ("CommandError: Port 8443 is already in use", True),
        ("django.core.exceptions.ImproperlyConfigured: SECRET_KEY", True),
    ],
)
def test_the_terminal_shows_warnings_and_errors_only(line, show):
    assert shown(line, in_error=False)[0] is show


def lines_shown(lines: list[str]) -> list[str]:
    in_error, out = False, []
    for line in lines:
        show, in_error = shown(line, in_error=in_error)
        if show:
            out.append(line)
    return out


def test_an_errors_traceback_is_shown_with_it_and_what_follows_it_is_not():
    traceback = [
        "Traceback (most recent call last):",
        '  File "/work/main/placement/tasks.py", line 27, in cluster_jobs_track_task',
        "    return cluster_jobs_track()",
        "",
        "django.db.utils.OperationalError: no such column",
    ]
    output = [CELERY_INFO, CELERY_ERROR, *traceback, CELERY_TASK_INFO, CELERY_INFO]
    assert lines_shown(output) == [CELERY_ERROR, *[line for line in traceback if line]]


def test_a_warning_takes_no_lines_after_it():
    """Beat's banner follows its first warning: it is start-up chatter, not the warning's."""
    output = [CONSOLE_WARNING, "LocalTime -> 2026-12-07 19:18:39", "    . loader -> celery"]
    assert lines_shown(output) == [CONSOLE_WARNING]


# -- the supervisor, on small processes of its own ---------------------------------------------

QUICK = Backoff(first=0.2, factor=2, ceiling=0.4, steady=30)


def wait_until(check, timeout=20.0, what="it"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not status.exists() or "State:\tZ" not in status.read_text()


@pytest.fixture
def supervised(tmp_path):
    said: list[str] = []
    made: list[Supervisor] = []

    def make(commands, **options):
        supervisor = Supervisor(
            commands, log_dir=tmp_path / "log", say=said.append, backoff=QUICK, **options
        )
        made.append(supervisor)
        supervisor.start_all()
        return supervisor

    yield make, said
    for supervisor in made:
        supervisor.stop(5)


def test_a_process_that_dies_is_started_again_with_a_line_saying_why(supervised, tmp_path):
    make, said = supervised
    supervisor = make({"sleeper": ["sleep", "300"], "other": ["sleep", "300"]})
    first, other = supervisor.pid("sleeper"), supervisor.pid("other")
    assert any(line.endswith(f"sleeper started (pid {first})") for line in said), said
    os.kill(first, signal.SIGKILL)

    def back():
        supervisor.check()
        return supervisor.pid("sleeper") not in (None, first)

    wait_until(back, what="the sleeper back")
    died = [line for line in said if f"sleeper (pid {first})" in line]
    assert len(died) == 1 and "was killed by SIGKILL after 0s up; restarting in 0s" in died[0]
    assert "(its log: " in died[0] and str(tmp_path / "log" / "sleeper.log") in died[0]
    assert any(f"sleeper started again (restart 1) (pid {supervisor.pid('sleeper')})" in line
               for line in said)  # fmt: skip
    assert supervisor.pid("other") == other  # the others are left alone
    log = (tmp_path / "log" / "sleeper.log").read_text()
    assert "was killed by SIGKILL" in log and "started again (restart 1)" in log


def test_a_process_that_keeps_failing_waits_longer_each_time(supervised):
    make, said = supervised
    supervisor = make({"failing": ["sh", "-c", "exit 3"]})
    wait_until(
        lambda: supervisor.check() or supervisor.children["failing"].restarts >= 3,
        what="three restarts",
    )
    waits = [line.split("restarting in ")[1].split(",")[0] for line in said if "exited" in line]
    assert all("failing (pid" in line for line in said if "exited with 3" in line)
    # 0.2 s, 0.4 s, then no longer (QUICK's ceiling), as durations in whole seconds.
    assert supervisor.children["failing"].delay == 0.4 and waits[:3] == ["0s", "0s", "0s"]


def test_a_process_that_dies_takes_what_it_started_with_it(supervised, tmp_path):
    """A Celery worker killed leaves its pool's processes: they go too, before the new one
    starts taking the same queue."""
    make, said = supervised
    pidfile = tmp_path / "grandchild"
    supervisor = make({"parent": ["sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait"]})
    wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the grandchild")
    grandchild = int(pidfile.read_text())
    os.kill(supervisor.pid("parent"), signal.SIGKILL)
    wait_until(lambda: supervisor.check() or not alive(grandchild), what="the grandchild gone")


def test_output_goes_to_a_0600_file_and_only_warnings_to_the_terminal(supervised, tmp_path):
    """R23: a process's log is the console's own, in a 0700 dir; a start keeps the last
    start's log once, as NAME.log.1."""
    (tmp_path / "log").mkdir(mode=0o755)
    (tmp_path / "log" / "talker.log").write_text("the last start's\n")
    make, said = supervised
    script = f"print({CELERY_INFO!r}); print({CELERY_WARNING!r}); import time; time.sleep(300)"
    make({"talker": [sys.executable, "-c", script]})
    log = tmp_path / "log" / "talker.log"
    wait_until(lambda: CELERY_WARNING in log.read_text(), what="the warning in the log")
    assert CELERY_INFO in log.read_text()
    wait_until(lambda: any(CELERY_WARNING in line for line in said), what="the warning said")
    assert f"talker | {CELERY_WARNING}" in said[-1]
    assert not any(CELERY_INFO in line for line in said)
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "log").stat().st_mode) == 0o700
    assert (tmp_path / "log" / "talker.log.1").read_text() == "the last start's\n"


def test_stop_ends_every_process_and_restarts_none(supervised):
    make, said = supervised
    supervisor = make({"a": ["sleep", "300"], "b": ["sh", "-c", "trap '' TERM; sleep 300"]})
    wait_until(lambda: supervisor.pid("b"), what="b")
    pids = [supervisor.pid("a"), supervisor.pid("b")]
    time.sleep(0.3)  # b's shell has set its trap
    assert supervisor.stop(1) == ["b"]  # b ignored SIGTERM: killed, and named
    assert not any(alive(pid) for pid in pids)
    supervisor.check()
    assert supervisor.pid("a") is None and supervisor.pid("b") is None
    assert not any("restarting" in line for line in said), said


def test_a_log_past_its_size_is_kept_once_as_log_1_and_begun_anew(supervised, tmp_path):
    """A console left running for weeks keeps two logs per process, not a growing one."""
    make, said = supervised
    script = "import time\nfor n in range(300): print(f'line {n:04d} ' + 'x' * 80)\ntime.sleep(300)"
    make({"talker": [sys.executable, "-c", script]}, log_bytes=10_000)
    log, kept = tmp_path / "log" / "talker.log", tmp_path / "log" / "talker.log.1"
    wait_until(lambda: "line 0299" in log.read_text(), what="the last line")
    assert 10_000 <= kept.stat().st_size < 10_000 + 100 and log.stat().st_size < 10_000
    lines = [kept.read_text().splitlines()[-1], log.read_text().splitlines()[0]]
    assert int(lines[1].split()[1]) == int(lines[0].split()[1]) + 1  # nothing lost between
    assert stat.S_IMODE(log.stat().st_mode) == stat.S_IMODE(kept.stat().st_mode) == 0o600
