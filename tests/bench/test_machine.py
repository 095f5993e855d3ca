"""tests/bench/machine.py reads the machine's busy and stolen time from /proc/stat."""

from tests.bench.machine import MachineCpu, cpu_times

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
