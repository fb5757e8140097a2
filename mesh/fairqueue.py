"""Bounded queues that serve their lanes in turn: one key's backlog never delays another key's first item.

I/O-free (no Trio here): the intake wraps them (`mesh.intake.JobQueue`). Lanes are whatever the caller keys them
by; the intake uses the offerer's public key, so an offerer that floods only lengthens its own lane.

`FairQueue` bounds `capacity` items in all and `per_lane` in any one lane. With `track_running`, an item popped
counts against its lane until the caller says it is `done`, so `per_lane` bounds what a key has unfinished (queued
or running), and a lane that already has `running_share` items running yields its turn to any lane with fewer, while
there is one (when none is waiting, it is served anyway: no worker idles for fairness' sake).

`ClassQueue` holds two classes of lanes, established and fresh (see `mesh.standing`): fresh lanes together may hold
at most `fresh_capacity` places and `fresh_workers` running items, so a swarm of fresh keys can never take the
places and the workers kept for established ones. Established lanes may use every place fresh ones leave free.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class FairQueue(Generic[T]):
    def __init__(
        self, capacity: int, per_lane: int, *, track_running: bool = False, running_share: int | None = None
    ) -> None:
        if capacity < 1 or not 1 <= per_lane <= capacity:
            raise ValueError("a fair queue needs 1 <= per_lane <= capacity")
        if running_share is not None and (running_share < 1 or not track_running):
            raise ValueError("a running share needs track_running and is at least 1")
        self.capacity = capacity
        self.per_lane = per_lane
        self.track_running = track_running
        self.running_share = running_share
        # Lanes in serving order: the next item comes from the first lane, which then goes to the back.
        self._lanes: OrderedDict[Hashable, deque[T]] = OrderedDict()
        self._size = 0
        self._running: Counter[Hashable] = Counter()

    def __len__(self) -> int:
        return self._size

    def lanes(self) -> int:
        return len(self._lanes)

    def depth(self, lane: Hashable) -> int:
        queued = self._lanes.get(lane)
        return 0 if queued is None else len(queued)

    def running(self, lane: Hashable | None = None) -> int:
        """Items popped and not yet done: of one lane, or of all."""
        return self._running[lane] if lane is not None else self._running.total()

    def held(self, lane: Hashable) -> int:
        """What counts against the lane's bound: its queued items, and its running ones when those are tracked."""
        return self.depth(lane) + self._running[lane]

    def has_room(self, lane: Hashable) -> bool:
        return self._size < self.capacity and self.held(lane) < self.per_lane

    def put(self, lane: Hashable, item: T) -> None:
        if not self.has_room(lane):
            raise OverflowError("no room in the queue or in this lane")
        queued = self._lanes.get(lane)
        if queued is None:
            queued = self._lanes[lane] = deque()  # a new lane joins at the back of the round
        queued.append(item)
        self._size += 1

    def pop(self) -> T | None:
        """The next item in round-robin order, or None when empty."""
        found = self.pop_lane()
        return None if found is None else found[1]

    def pop_lane(self) -> tuple[Hashable, T] | None:
        """The next item and its lane, in round-robin order; lanes past their running share wait their turn."""
        if not self._lanes:
            return None
        lane = next(iter(self._lanes))
        if self.running_share is not None and self._running[lane] >= self.running_share:
            # The first lane in turn below its share, if any; else the turn goes as usual (work-conserving).
            lane = next((k for k in self._lanes if self._running[k] < self.running_share), lane)
        queued = self._lanes[lane]
        item = queued.popleft()
        self._size -= 1
        if queued:
            self._lanes.move_to_end(lane)
        else:
            del self._lanes[lane]
        if self.track_running:
            self._running[lane] += 1
        return lane, item

    def done(self, lane: Hashable) -> None:
        """An item popped from `lane` is finished: it no longer counts against the lane."""
        if not self.track_running or self._running[lane] < 1:
            raise ValueError("nothing of this lane is running")
        self._running[lane] -= 1
        if not self._running[lane]:
            del self._running[lane]


class ClassQueue(Generic[T]):
    """Two classes of fair lanes: established ones first, fresh ones within their share of places and workers.

    When both classes have an item a worker may take, established items go first, except that after
    `established_run` established items in a row a waiting fresh item is taken: fresh offerers are slowed by a flood
    of established work, never shut out.
    """

    def __init__(
        self,
        capacity: int,
        per_lane: int,
        *,
        fresh_capacity: int,
        fresh_workers: int,
        running_share: int | None = None,
        established_run: int = 3,
    ) -> None:
        if not 1 <= fresh_capacity <= capacity or fresh_workers < 1 or established_run < 1:
            raise ValueError("a class queue needs 1 <= fresh_capacity <= capacity, fresh_workers >= 1")
        self.capacity = capacity
        self.fresh_workers = fresh_workers
        self.established_run = established_run
        self.established: FairQueue[T] = FairQueue(capacity, per_lane, track_running=True, running_share=running_share)
        self.fresh: FairQueue[T] = FairQueue(
            fresh_capacity, min(per_lane, fresh_capacity), track_running=True, running_share=running_share
        )
        self._in_a_row = 0  # established items taken, since the last fresh one, while a fresh one could have been

    def __len__(self) -> int:
        return len(self.established) + len(self.fresh)

    def _class(self, established: bool) -> FairQueue[T]:
        return self.established if established else self.fresh

    def held(self, lane: Hashable) -> int:
        """A lane's queued and running items in both classes: an offerer promoted while it has fresh work queued
        still has one budget."""
        return self.established.held(lane) + self.fresh.held(lane)

    def has_room(self, lane: Hashable, established: bool) -> bool:
        return (
            len(self) < self.capacity
            and self.held(lane) < self.established.per_lane
            and self._class(established).has_room(lane)
        )

    def put(self, lane: Hashable, item: T, established: bool) -> None:
        if not self.has_room(lane, established):
            raise OverflowError("no room in the queue or in this lane")
        self._class(established).put(lane, item)

    def fresh_may_run(self) -> bool:
        return len(self.fresh) > 0 and self.fresh.running() < self.fresh_workers

    def pop(self) -> tuple[Hashable, T, bool] | None:
        """(lane, item, established) of the next item a worker may take now, or None."""
        fresh_ok = self.fresh_may_run()
        take_established = len(self.established) > 0 and not (fresh_ok and self._in_a_row >= self.established_run)
        if take_established:
            self._in_a_row += fresh_ok
            found = self.established.pop_lane()
            assert found is not None
            return found[0], found[1], True
        if not fresh_ok:
            return None
        self._in_a_row = 0
        found = self.fresh.pop_lane()
        assert found is not None
        return found[0], found[1], False

    def done(self, lane: Hashable, established: bool) -> None:
        self._class(established).done(lane)
