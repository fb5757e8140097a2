"""Bounded bookkeeping for the intake: per-peer token buckets (the replay memory is mesh/replay.py).

The buckets are capped in number, so a peer that invents identities by the million costs us a fixed amount of
memory. Time is injected (`now` in seconds, monotonic) so that tests and simulations control the clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """A token bucket per key (an offerer's or an agent's public key), refilled at `rate` a second up to `burst`.

    Key only by identities that have already proven themselves (a verified signature), so that nobody can drain
    another's bucket by sending forgeries in its name.
    """

    def __init__(self, rate: float, burst: float, max_keys: int = 10_000) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a token bucket needs a positive rate and a burst of at least one")
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        self._buckets: OrderedDict[Hashable, _Bucket] = OrderedDict()

    def allow(self, key: Hashable, now: float) -> bool:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = _Bucket(self.burst, now)
            self._buckets[key] = bucket
            if len(self._buckets) > self.max_keys:
                # The least recently active peer is forgotten; it comes back with a full bucket, which is the
                # cost of bounded memory (and at most `burst` extra offers).
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
            bucket.updated = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return True
        return False
