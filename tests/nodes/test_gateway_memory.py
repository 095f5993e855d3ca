"""A gateway replica's garbage collector (issue 20): start-up's objects are left out of
every collection, young collections are made rarer, and every collection's pause is timed
for Prometheus; below Python, glibc's free pages are handed back, and its arenas capped
where an operator says."""

import ctypes
import gc
import time

import pytest

from nodes.gateway import memory


@pytest.fixture
def restored_collector():
    threshold = gc.get_threshold()
    callbacks = list(gc.callbacks)
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)
    gc.callbacks[:] = callbacks


def test_start_up_is_frozen_and_young_collections_made_rarer(restored_collector):
    made_at_start = [[] for _ in range(1000)]  # containers the collector tracks

    frozen = memory.freeze_start_up()

    # Not equal to the count read later: a frozen object that dies meanwhile (another
    # thread's) leaves the permanent generation (seen once in CI).
    assert frozen >= len(made_at_start) and gc.get_freeze_count() >= len(made_at_start)
    assert gc.get_threshold()[0] == memory.YOUNG_THRESHOLD > 700
    # Left out of every collection: a full one no longer walks them.
    walked = {id(x) for x in gc.get_objects()}
    assert not any(id(x) in walked for x in made_at_start)
    made_later = []
    assert id(made_later) in {id(x) for x in gc.get_objects()}


def test_every_collection_is_timed_by_generation(restored_collector):
    def count(generation: str) -> float:
        return memory.GC_PAUSE.labels(generation)._sum.get(), sum(
            bucket.get() for bucket in memory.GC_PAUSE.labels(generation)._buckets
        )

    memory.time_pauses()
    memory.time_pauses()  # once only, however often it is asked
    before = count("2")
    gc.collect(2)
    after = count("2")

    assert after[1] == before[1] + 1 and after[0] > before[0]


def test_trim_hands_freed_native_memory_back_to_the_kernel():
    """Freed chunks below the heap's top stay resident until malloc_trim: the growth the
    gateway showed under 10,000 streams (issue 20) that Python's own blocks did not."""
    libc = memory._glibc()
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    chunks = [libc.malloc(4096) for _ in range(40_000)]  # 160 MiB, under mmap's threshold
    for chunk in chunks:
        ctypes.memset(chunk, 1, 4096)  # resident
    for chunk in chunks[:-1]:  # the last one pins the top: free() alone cannot trim
        libc.free(chunk)
    trims_before = memory.MALLOC_TRIM._sum.get()
    try:
        released = memory.trim()
    finally:
        libc.free(chunks[-1])
    assert released > 100 * 2**20
    assert memory.MALLOC_TRIM._sum.get() > trims_before
    assert memory.MALLOC_TRIM_RELEASED._value.get() >= released


def test_the_trimmer_trims_on_its_timer_until_stopped():
    counted = sum(bucket.get() for bucket in memory.MALLOC_TRIM._buckets)
    trimmer = memory.Trimmer(every=0.01)
    trimmer.start()
    deadline = time.monotonic() + 10
    while sum(b.get() for b in memory.MALLOC_TRIM._buckets) < counted + 3:
        assert time.monotonic() < deadline, "no trim on the timer"
        time.sleep(0.01)
    trimmer.stop()
    trimmer.join(timeout=5)
    assert not trimmer.is_alive()


def test_glibc_takes_an_arena_cap_and_none_is_left_alone():
    assert memory.limit_arenas(0) is False  # the default: glibc's own limit
    assert memory.limit_arenas(64)  # glibc's limit on two cores is 16: this changes nothing
