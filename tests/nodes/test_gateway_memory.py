"""A gateway replica's garbage collector (issue 20): start-up's objects are left out of
every collection, young collections are made rarer, and every collection's pause is timed
for Prometheus."""

import gc

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
