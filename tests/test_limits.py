"""The intake's and the coordinator's bounded bookkeeping: token buckets and the replay cache."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mesh.limits import RateLimiter


def test_a_bucket_refills_at_its_rate_and_is_per_key() -> None:
    limiter = RateLimiter(rate=2.0, burst=2)
    assert limiter.allow(b"a", 0.0) and limiter.allow(b"a", 0.0)
    assert not limiter.allow(b"a", 0.0)
    assert limiter.allow(b"b", 0.0)
    assert limiter.allow(b"a", 0.5) and not limiter.allow(b"a", 0.5)


@given(st.lists(st.floats(min_value=0, max_value=0.2), max_size=200))
def test_never_more_than_burst_plus_rate_times_elapsed(gaps: list[float]) -> None:
    limiter = RateLimiter(rate=5.0, burst=3)
    now, allowed = 0.0, 0
    for gap in gaps:
        now += gap
        allowed += limiter.allow("k", now)
    assert allowed <= 3 + 5.0 * now + 1e-9


def test_the_number_of_buckets_is_bounded() -> None:
    limiter = RateLimiter(rate=1.0, burst=1, max_keys=100)
    for i in range(10_000):
        limiter.allow(i, 0.0)
    assert len(limiter._buckets) == 100


def test_a_bucket_needs_a_rate_and_a_burst() -> None:
    with pytest.raises(ValueError):
        RateLimiter(rate=0, burst=1)
