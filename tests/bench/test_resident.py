"""tests/bench/resident.py reads /proc/PID/smaps the way glibc lays out its arenas."""

import os

from tests.bench.resident import resident_by_kind, resident_of

SMAPS = """\
55d0c0a00000-55d0c0c00000 rw-p 00000000 00:00 0                          [heap]
Size:               2048 kB
Rss:                1024 kB
7f1a00000000-7f1a02000000 rw-p 00000000 00:00 0
Rss:                4096 kB
7f1a02000000-7f1a04000000 ---p 00000000 00:00 0
Rss:                   0 kB
7f1a04000000-7f1a08000000 rw-p 00000000 00:00 0
Rss:                8192 kB
7f1a08100000-7f1a08200000 rw-p 00000000 00:00 0
Rss:                 512 kB
7f1a08200000-7f1a08300000 rw-p 00000000 00:00 0                          [stack]
Rss:                 128 kB
7f1a0c000000-7f1a10000001 rw-p 00000000 00:00 0
Rss:                2048 kB
7f1a14000000-7f1a14100000 r-xp 00000000 08:01 1234                       /usr/lib/libc.so.6
Rss:                 256 kB
"""


def test_each_mapping_counted_by_its_kind():
    kinds = resident_by_kind(SMAPS)
    assert kinds == {
        "main heap": 1.0,
        # 64 MiB-aligned and at most 64 MiB: the partly used heap (its PROT_NONE tail
        # is not) and the full one.
        "thread heaps": 12.0,
        # Not aligned; a named [stack]; one byte larger than a thread heap can be.
        "other anonymous": (512 + 128 + 2048) / 1024,
        "files": 0.25,
        "thread heap count": 2,
    }


def test_reads_a_live_process():
    kinds = resident_of(os.getpid())
    assert kinds["files"] > 0 and kinds["main heap"] + kinds["other anonymous"] > 0
