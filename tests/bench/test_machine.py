"""tests/bench/machine.py reads the machine's busy and stolen time from /proc/stat."""

import os

from tests.bench.machine import MachineCpu, cpu_times, process_cpu_seconds

STAT = "cpu  {user} 0 {system} {idle} {iowait} 0 0 {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"


def stat(user, system, idle, iowait, steal):
    return STAT.format(user=user, system=system, idle=idle, iowait=iowait, steal=steal)


def test_cpu_times_are_all_steal_and_idle_with_iowait():
    assert cpu_times(stat(100, 50, 800, 30, 20)) == (1000, 20, 830)


def test_each_interval_is_busy_and_stolen_time_over_all_time(tmp_path):
    proc_stat = tmp_path / "stat"
    proc_stat.write_text(stat(0, 0, 0, 0, 0))
    machine = MachineCpu(every=3600, stat=proc_stat)
    machine.start()
    # 1,000 ticks: 300 working, 600 idle, 100 stolen by the hypervisor (busy: not idle).
    proc_stat.write_text(stat(200, 100, 550, 50, 100))
    line = machine.stop()
    assert machine.intervals == [(0.4, 0.1)]
    assert line == (
        "machine: both cores 40% busy on average; steal 10.0% on average, at most 10.0% in 3600 s"
    )


def test_a_process_cpu_is_its_user_and_system_ticks_whatever_its_name_holds(tmp_path):
    tick = os.sysconf("SC_CLK_TCK")
    for pid, name, user, system in ((7, "python", 3, 1), (8, "a) b (c", 5, 0)):
        (tmp_path / str(pid)).mkdir()
        # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
        # utime stime cutime cstime ...: children's time (cutime) is not the process's.
        (tmp_path / str(pid) / "stat").write_text(
            f"{pid} ({name}) S 1 1 1 0 -1 0 9 9 9 9 {user * tick} {system * tick} 50 50 20 0\n"
        )
    assert process_cpu_seconds(7, 8, proc=tmp_path) == 9
