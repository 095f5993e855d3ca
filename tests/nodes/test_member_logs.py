"""A member's log on its node read from an offset (nodes/agent/member/logs.py): offsets count
the member's output from its first byte across cuts (R16), a read past a cut says so and
starts at the oldest byte kept, and only what is answered is read from the disk."""

import os

from nodes.agent.member import logs


def written(path, data: bytes) -> None:
    with path.open("ab") as handle:
        handle.write(data)


def test_a_read_from_an_offset_answers_what_was_written_from_it_on(tmp_path):
    log = tmp_path / "m-1.log"
    written(log, b"line-1\nline-2\nline-3\n")
    read = logs.read(log, 100, offset=7)
    assert (read.data, read.offset, read.next_offset, read.truncated) == (
        b"line-2\nline-3\n",
        7,
        21,
        False,
    )
    bounded = logs.read(log, 5, offset=0)
    assert (bounded.data, bounded.next_offset) == (b"line-", 5)
    # Polling with next_offset follows the log: nothing new, then only what came since.
    assert logs.read(log, 100, offset=21).data == b""
    written(log, b"line-4\n")
    assert logs.read(log, 100, offset=read.next_offset).data == b"line-4\n"


def test_without_an_offset_the_tail_is_answered_with_where_it_starts(tmp_path):
    log = tmp_path / "m-1.log"
    written(log, b"0123456789")
    read = logs.read(log, 4)
    assert (read.data, read.offset, read.next_offset, read.truncated) == (b"6789", 6, 10, False)
    whole = logs.read(log, 100)
    assert (whole.data, whole.offset) == (b"0123456789", 0)


def test_an_offset_past_the_end_answers_nothing_from_the_end(tmp_path):
    log = tmp_path / "m-1.log"
    written(log, b"abc")
    read = logs.read(log, 100, offset=50)
    assert (read.data, read.offset, read.next_offset, read.truncated) == (b"", 3, 3, False)


def test_R16_a_log_cut_past_the_offset_says_so_and_starts_at_the_oldest_byte_kept(tmp_path):
    log = tmp_path / "m-1.log"
    output = bytes(range(256)) * 1000  # 256,000 bytes, each telling its offset mod 256
    written(log, output)
    assert logs.cut(log, 100_000)
    kept = 100_000 // 2 - len(logs.CUT_NOTE)
    oldest = len(output) - kept
    read = logs.read(log, 1 << 20, offset=10)
    assert (read.offset, read.next_offset, read.truncated) == (oldest, len(output), True)
    assert read.data == output[oldest:]  # the node's note is not the member's output
    # Offsets go on counting after the cut, and a later cut keeps counting from them.
    written(log, b"after\n")
    assert logs.read(log, 100, offset=len(output)).data == b"after\n"
    assert logs.read(log, 3, offset=oldest + 1).data == output[oldest + 1 : oldest + 4]
    more = b"x" * 200_000
    written(log, more)
    assert logs.cut(log, 100_000)
    end = len(output) + len(b"after\n") + len(more)
    read = logs.read(log, 1 << 20, offset=len(output))
    assert (read.offset, read.next_offset, read.truncated) == (end - kept, end, True)
    assert read.data == more[-kept:]
    tail = logs.read(log, 10)
    assert (tail.data, tail.offset, tail.truncated) == (b"x" * 10, end - 10, False)


def test_R16_a_tail_reaching_before_a_cut_says_so(tmp_path):
    log = tmp_path / "m-1.log"
    written(log, b"y" * 1000)
    assert logs.cut(log, 400)
    read = logs.read(log, 1 << 20)
    assert read.truncated and read.offset == 1000 - (200 - len(logs.CUT_NOTE))
    assert read.data == b"y" * (200 - len(logs.CUT_NOTE))


def test_only_what_is_answered_is_read_from_the_disk(tmp_path):
    """A follower's read near the end of a 256 MiB log reads kilobytes, not the log: the file
    is seeked to the offset (rchar counts every byte this process reads)."""
    log = tmp_path / "m-1.log"
    with log.open("wb") as handle:
        handle.truncate(256 << 20)
        handle.seek(0, os.SEEK_END)
        handle.write(b"newest\n")

    def bytes_read() -> int:
        with open("/proc/self/io") as io:
            return int(next(line for line in io if line.startswith("rchar:")).split()[1])

    before = bytes_read()
    read = logs.read(log, 4096, offset=256 << 20)
    assert read.data == b"newest\n"
    assert bytes_read() - before < 1 << 20


def test_a_member_without_a_log_here_is_none_and_its_offset_file_expires_with_its_log(tmp_path):
    assert logs.read(tmp_path / "m-0.log", 100, offset=0) is None
    log = tmp_path / "m-1.log"
    written(log, b"z" * 1000)
    logs.cut(log, 400)
    os.utime(log, (0, 0))
    assert sorted(path.name for path in logs.expired(tmp_path, 60, keep=set())) == [
        "m-1.log",
        "m-1.offset",
    ]
    assert logs.expired(tmp_path, 60, keep={"m-1"}) == []
