"""The fair queue: bounded in total and per lane, FIFO within a lane, and lanes served in turn."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mesh.fairqueue import ClassQueue, FairQueue

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


# A script for the class queue: put into (lane, established), pop, or finish the k-th running item.
class_ops = st.lists(
    st.tuples(st.just("put"), st.integers(0, 5), st.booleans())
    | st.tuples(st.just("pop"), st.just(0), st.just(False))
    | st.tuples(st.just("done"), st.integers(0, 10), st.just(False)),
    max_size=300,
)


@given(
    class_ops,
    st.integers(1, 16),
    st.integers(1, 8),
    st.integers(1, 16),
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 3),
)
def test_class_queue_keeps_every_share_and_never_idles_a_worker_it_may_use(
    ops: list[tuple[str, int, bool]],
    capacity: int,
    per_lane: int,
    fresh_capacity: int,
    fresh_workers: int,
    running_share: int,
    established_run: int,
) -> None:
    per_lane, fresh_capacity = min(per_lane, capacity), min(fresh_capacity, capacity)
    queue: ClassQueue[tuple[int, bool, int]] = ClassQueue(
        capacity,
        per_lane,
        fresh_capacity=fresh_capacity,
        fresh_workers=fresh_workers,
        running_share=running_share,
        established_run=established_run,
    )
    running: list[tuple[int, bool]] = []
    seq: defaultdict[tuple[int, bool], int] = defaultdict(int)
    next_out: defaultdict[tuple[int, bool], int] = defaultdict(int)
    in_a_row = 0
    for op, lane, established in ops:
        if op == "put":
            key = (lane, established)
            if queue.has_room(lane, established):
                queue.put(lane, (lane, established, seq[key]), established)
                seq[key] += 1
            else:
                with pytest.raises(OverflowError):
                    queue.put(lane, (lane, established, -1), established)
        elif op == "pop":
            fresh_could = len(queue.fresh) > 0 and queue.fresh.running() < fresh_workers
            could = len(queue.established) > 0 or fresh_could
            found = queue.pop()
            assert (found is not None) == could  # no worker is left idle when there is work it may take
            if found is None:
                continue
            got_lane, (item_lane, item_class, item_seq), got_class = found
            assert (got_lane, got_class) == (item_lane, item_class)
            assert item_seq == next_out[(item_lane, item_class)]  # FIFO within a lane
            next_out[(item_lane, item_class)] += 1
            running.append((item_lane, item_class))
            if got_class and fresh_could:
                in_a_row += 1
                assert in_a_row <= established_run  # fresh work is slowed, never shut out
            elif not got_class:
                in_a_row = 0
        elif running:
            done_lane, done_class = running.pop(lane % len(running))
            queue.done(done_lane, done_class)
        assert len(queue) <= capacity
        assert len(queue.fresh) <= fresh_capacity
        assert queue.fresh.running() <= fresh_workers
        for lane_key in range(6):
            assert queue.held(lane_key) <= per_lane and queue.fresh.held(lane_key) <= queue.fresh.per_lane


@given(st.lists(st.integers(0, 4), min_size=1, max_size=40), st.integers(1, 3))
def test_a_lane_at_its_running_share_yields_to_lanes_below_it(puts: list[int], share: int) -> None:
    queue: FairQueue[int] = FairQueue(64, 64, track_running=True, running_share=share)
    for lane in puts:
        queue.put(lane, lane)
    while len(queue):
        below = {lane for lane in range(5) if queue.depth(lane) and queue.running(lane) < share}
        found = queue.pop_lane()
        assert found is not None
        assert not below or found[0] in below


def test_done_without_a_running_item_is_an_error() -> None:
    queue: FairQueue[int] = FairQueue(4, 2, track_running=True)
    with pytest.raises(ValueError):
        queue.done(1)
