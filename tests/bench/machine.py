"""The machine's CPU during a bench, as /proc/stat counts it: how busy its cores were, and
how much of their time the hypervisor took (``steal``). Runs on a shared VM vary with its
neighbours: a restart of 10,000 nodes took 43.0 s in a run with up to 47% steal and 26.8–31.7 s
with none (README, "A gateway at fleet scale"), so each run says what it ran on."""

import os
import threading
from pathlib import Path

SAMPLE_SECONDS = 10.0


def cpu_times(stat: str) -> tuple[int, int, int]:
    """All, steal and idle (idle + iowait) ticks of the machine, from /proc/stat's text."""
    # user nice system idle iowait irq softirq steal; guest time after them is already in user.
    ticks = [int(value) for value in stat.splitlines()[0].split()[1:9]]
    return sum(ticks), ticks[7], ticks[3] + ticks[4]


def process_cpu_seconds(*pids: int, proc: Path = Path("/proc")) -> float:
    """User and system CPU the processes have used so far, from /proc/PID/stat. The machine's
    speed moved 2× within an hour here, so a bench says what its work cost as well as how
    long it took."""
    ticks = 0
    for pid in pids:
        # After the command's ")": state is field 3, utime 14 and stime 15 (proc(5)).
        fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


class MachineCpu(threading.Thread):
    """Reads /proc/stat every ``every`` seconds until ``stop``, which returns what it saw."""

    def __init__(self, every: float = SAMPLE_SECONDS, stat: Path = Path("/proc/stat")):
        super().__init__(daemon=True)
        self.every, self.stat = every, stat
        self.intervals: list[tuple[float, float]] = []  # (busy, steal), fractions of all time
        self.stopping = threading.Event()

    def start(self) -> None:
        self.first = cpu_times(self.stat.read_text())  # read before start returns
        super().start()

    def run(self) -> None:
        before = self.first
        while True:
            stopping = self.stopping.wait(self.every)
            now = cpu_times(self.stat.read_text())
            elapsed = now[0] - before[0]
            if elapsed > 0:
                idle, steal = now[2] - before[2], now[1] - before[1]
                self.intervals.append((1 - idle / elapsed, steal / elapsed))
            before = now
            if stopping:
                return

    def stop(self) -> str:
        self.stopping.set()
        self.join()
        if not self.intervals:
            return "machine: not measured"
        busy = [b for b, _ in self.intervals]
        steal = [s for _, s in self.intervals]
        return (
            f"machine: both cores {100 * sum(busy) / len(busy):.0f}% busy on average; "
            f"steal {100 * sum(steal) / len(steal):.1f}% on average, at most "
            f"{100 * max(steal):.1f}% in {self.every:g} s"
        )
