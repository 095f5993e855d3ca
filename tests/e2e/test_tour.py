"""README's five-minute tour, pasted as written (issue 39): its first block is `make run`
(runconsole, as `make run` starts it), its second is run by bash as a newcomer types it in a
second terminal, on this machine without a GPU. Only what a test must change is changed: the
console's port (another test may hold 8000), and the places a user's machine has of its own
(the agent's state dir, the CLI's config), moved under the test's directory. Each command's
time is printed (`pytest -s`): the tour as a user meets it."""

import contextlib
import os
import re
import signal
import subprocess
import time

from .console import ROOT, Console, console_env, free_port

TOUR = re.compile(r"^## Five-minute tour\n(.*?)^## ", re.S | re.M)
BLOCK = re.compile(r"```bash\n(.*?)```", re.S)


def tour_blocks() -> list[str]:
    section = TOUR.search((ROOT / "README.md").read_text()).group(1)
    return BLOCK.findall(section)


def test_the_tour_is_two_blocks_make_run_then_the_second_terminal():
    first, second = tour_blocks()
    assert first.strip() == "make run"
    assert "tuneplane apply -f examples/job.yaml" in second
    assert "tuneplane logs training-job 1 -f" in second


def test_readmes_tour_works_as_written_on_a_machine_without_a_gpu(tmp_path, empty_database):
    _, script = tour_blocks()
    env = console_env(tmp_path / "var", DATABASE_URL=empty_database)
    env.pop("REDIS_URL", None)  # make run's embedded broker
    port = free_port()
    script = script.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    script = script.replace("$PWD/var/node", str(tmp_path / "node"))
    home = tmp_path / "home"
    home.mkdir()
    shell_env = {**env, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
    console = Console(env, port)
    tour = None
    try:
        console.wait_for("Tuneplane console is up")
        # Each command timed: bash's trace with the clock, on its own file descriptor.
        trace = tmp_path / "trace"
        typed = f"exec 7>{trace}; BASH_XTRACEFD=7; PS4='+ $EPOCHREALTIME '; set -ex\n{script}"
        # Its output to a file: the agent it leaves serving in the background keeps a pipe
        # open after the script has ended.
        typed_out = tmp_path / "output"
        with typed_out.open("w") as sink:
            tour = subprocess.Popen(
                ["bash", "-c", typed],
                cwd=ROOT,
                env=shell_env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # the agent it starts in the background goes with it
            )
        tour.wait(timeout=300)
        ended = time.time()
        output = typed_out.read_text()
        assert tour.returncode == 0, f"the tour failed:\n{output[-4000:]}\n{console.output[-3000:]}"
        assert "admitted to Fleet gpu-lab" in output  # apply's first line
        assert "trainingjob.succeeded" in output  # the job's history, its last event
        _print_timings(trace.read_text(), ended)
    finally:
        if tour is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(tour.pid, signal.SIGTERM)
            time.sleep(1)
        console.stop()


# The commands a user types in the tour (the rest of a trace is what they run: the venv's
# activate script, a pipe's other half).
TYPED = {".", "make", "tuneplane", "curl", "python", "pip", "export", "tuneplane-node"}


def _print_timings(trace: str, ended: float) -> None:
    """Each command of the tour's script as typed, and how long until the next began."""
    steps = [
        (float(stamp), command)
        for stamp, command in re.findall(r"^\++ (\d+\.\d+) (.*)$", trace, re.M)
        if command.split(" ", 1)[0] in TYPED
    ]
    print("\nREADME's tour, as a user types it:")
    for (began, command), (then, _) in zip(steps, [*steps[1:], (ended, "")], strict=True):
        print(f"  {then - began:6.1f} s  {command[:100]}")
