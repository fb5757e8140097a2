"""A token bucket per key (an agent's or an offerer's public key), in memory.

Buckets are keyed only by keys whose signature has been verified, so nobody can drain another agent's bucket by
sending unsigned requests in its name. Losing the buckets on restart only forgives a little.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import trio

MAX_BUCKETS = 10_000


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float


class TokenBuckets:
    def __init__(self, rate_per_s: float, burst: float, *, clock: Callable[[], float] = trio.current_time) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("a token bucket needs a positive rate and a burst of at least one")
        self.rate = rate_per_s
        self.burst = burst
        self._clock = clock
        self._buckets: dict[bytes, _Bucket] = {}

    def take(self, key: bytes) -> bool:
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= MAX_BUCKETS:
                self._forget_full(now)
            bucket = self._buckets[key] = _Bucket(self.burst, now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
        bucket.updated = now
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    def _forget_full(self, now: float) -> None:
        """A bucket that has refilled is the same as no bucket: drop those, so many keys cannot grow the map."""
        refill_s = self.burst / self.rate
        for key in [k for k, b in self._buckets.items() if now - b.updated >= refill_s]:
            del self._buckets[key]
