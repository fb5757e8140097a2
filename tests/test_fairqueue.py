"""The fair queue: bounded in total and per lane, FIFO within a lane, and lanes served in turn."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mesh.fairqueue import FairQueue

# A script of operations: a lane number to put into, or None to pop.
scripts = st.lists(st.none() | st.integers(0, 5), max_size=300)


@given(scripts, st.integers(1, 20), st.integers(1, 20))
def test_bounds_order_and_turns(script: list[int | None], capacity: int, per_lane: int) -> None:
    per_lane = min(per_lane, capacity)
    queue: FairQueue[tuple[int, int]] = FairQueue(capacity, per_lane)
    put_seq: defaultdict[int, int] = defaultdict(int)
    next_out: defaultdict[int, int] = defaultdict(int)
    waiting_since: dict[int, int] = {}  # lane -> the step at which it last became non-empty or was last served
    for step, op in enumerate(script):
        if op is None:
            item = queue.pop()
            if item is None:
                assert len(queue) == 0
                continue
            lane, seq = item
            # FIFO within a lane.
            assert seq == next_out[lane]
            next_out[lane] += 1
            # Turns: the lane served is the one that has waited longest among the non-empty ones.
            assert waiting_since[lane] == min(waiting_since.values())
            if queue.depth(lane):
                waiting_since[lane] = step
            else:
                del waiting_since[lane]
            continue
        room = queue.has_room(op)
        assert room == (len(queue) < capacity and queue.depth(op) < per_lane)
        if not room:
            with pytest.raises(OverflowError):
                queue.put(op, (op, -1))
            continue
        if not queue.depth(op):
            waiting_since[op] = step
        queue.put(op, (op, put_seq[op]))
        put_seq[op] += 1
        assert len(queue) <= capacity and queue.depth(op) <= per_lane


def test_a_lane_bound_above_the_capacity_is_refused() -> None:
    with pytest.raises(ValueError):
        FairQueue(4, 5)
