"""Fixed-window counts in the shared cache (Redis with REDIS_URL, so every replica counts
together), each a single atomic increment. While the cache is away they count in this
process: what they guard goes on, still bounded, per replica.

Throttles (the join endpoint's) ask how many in this window; rate-limited records (one
audit event per client and reason a minute, one per node for its stray commands, card names
a node may add an hour) ask whether this is the first of its window and how many came since
the last one recorded.
"""

import hashlib
import logging

import redis
from django.core.cache import caches
from django.core.cache.backends.locmem import LocMemCache
from django.core.cache.backends.redis import RedisCache

logger = logging.getLogger("tuneplane")

_local_cache = LocMemCache("tuneplane-windows", {})

# How long a running total outlives its last increment.
TOTAL_TIMEOUT = 24 * 3600


def _key(scope: str, parts) -> str:
    digest = hashlib.sha256("\x1f".join(str(part) for part in parts).encode()).hexdigest()
    return f"window:{scope}:{digest[:32]}"


# One step on Redis: the increment, and the window's expiry armed whenever the key has none
# (a new window, or one a non-atomic count left without an expiry, which would otherwise
# count for ever).
COUNT_SCRIPT = """
local count = redis.call('INCRBY', KEYS[1], ARGV[1])
if redis.call('TTL', KEYS[1]) < 0 then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
return count
"""


def _count(cache, key: str, seconds: int, delta: int = 1) -> int:
    if isinstance(cache, RedisCache):
        full_key = cache.make_and_validate_key(key)
        client = cache._cache.get_client(full_key, write=True)
        return int(client.eval(COUNT_SCRIPT, 1, full_key, delta, max(int(seconds), 1)))
    # In this process: the lock-protected local cache keeps a key's expiry on incr.
    cache.add(key, 0, timeout=seconds)  # starts the window, unless one is running
    try:
        return cache.incr(key, delta)
    except ValueError:  # the window ended between the two calls
        cache.add(key, 0, timeout=seconds)
        return cache.incr(key, delta)


def _with_fallback(call):
    try:
        return call(caches["default"])
    except redis.RedisError as error:
        logger.warning("counting in this process while the cache is away (%s)", error)
        return call(_local_cache)


def count_in_window(scope: str, *parts, seconds: int, delta: int = 1) -> int:
    """These ``delta`` included, how many of ``parts`` in the current window of ``seconds``."""
    key = _key(scope, parts)
    return _with_fallback(lambda chosen: _count(chosen, key, seconds, delta))


def first_in_window(scope: str, *parts, seconds: int, delta: int = 1) -> int:
    """0 while a window of ``seconds`` for ``parts`` is running; at the first of a new
    window, how many there were since the previous first (these ``delta`` included), so
    that one record a window still counts every occurrence."""
    key = _key(scope, parts)

    def tally(cache) -> int:
        total = _count(cache, key + ":total", TOTAL_TIMEOUT, delta)
        if not cache.add(key + ":open", 1, timeout=seconds):
            return 0
        recorded = cache.get(key + ":recorded") or 0
        cache.set(key + ":recorded", total, timeout=TOTAL_TIMEOUT)
        return max(total - recorded, 1)

    return _with_fallback(tally)
