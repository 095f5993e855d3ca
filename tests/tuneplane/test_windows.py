"""Rate windows (tuneplane/windows.py) on a real Redis: a window always ends. The count and
its expiry are one step (a Lua script), so a window that expires between a check and an
increment can no longer be re-created without an expiry — the key that held 8,053 joins with
no TTL and refused one address for ever (issue 37)."""

import time

import pytest
from django.core.cache import caches

from tuneplane import windows

pytestmark = pytest.mark.redis


@pytest.fixture
def redis_client(require_redis):
    cache = caches["default"]
    assert isinstance(cache, windows.RedisCache), "the suite's cache is Redis under REDIS_URL"

    def client_and_key(scope, *parts):
        key = cache.make_and_validate_key(windows._key(scope, parts))
        return cache._cache.get_client(key, write=True), key

    return client_and_key


def test_a_window_left_without_an_expiry_is_given_one_and_ends(redis_client):
    client, key = redis_client("join", "10.0.0.9")
    client.set(key, 8053)  # what the old check-then-INCR left when the window expired between
    assert client.ttl(key) == -1
    assert windows.count_in_window("join", "10.0.0.9", seconds=1) == 8054
    assert 0 < client.ttl(key) <= 1
    time.sleep(1.2)
    assert windows.count_in_window("join", "10.0.0.9", seconds=1) == 1  # a new window


def test_a_window_expiring_between_counts_starts_again_with_an_expiry(redis_client):
    client, key = redis_client("join", "10.0.0.10")
    assert windows.count_in_window("join", "10.0.0.10", seconds=60) == 1
    client.delete(key)  # the window ends right here, between two counts
    assert windows.count_in_window("join", "10.0.0.10", seconds=60) == 1
    assert 0 < client.ttl(key) <= 60
    assert windows.count_in_window("join", "10.0.0.10", seconds=60, delta=3) == 4
    assert 0 < client.ttl(key) <= 60  # the running window's expiry is kept, not extended
