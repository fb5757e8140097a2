"""A bounded queue that serves its lanes in turn: one key's backlog never delays another key's first item.

I/O-free (no Trio here): the intake wraps it (`mesh.intake.JobQueue`). Lanes are whatever the caller keys them by;
the intake uses the offerer's public key, so an offerer that floods only lengthens its own lane. Bounds: `capacity`
items in all, and `per_lane` in any one lane, so a single key can hold at most `per_lane` of the queue's places.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class FairQueue(Generic[T]):
    def __init__(self, capacity: int, per_lane: int) -> None:
        if capacity < 1 or not 1 <= per_lane <= capacity:
            raise ValueError("a fair queue needs 1 <= per_lane <= capacity")
        self.capacity = capacity
        self.per_lane = per_lane
        # Lanes in serving order: the next item comes from the first lane, which then goes to the back.
        self._lanes: OrderedDict[Hashable, deque[T]] = OrderedDict()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def lanes(self) -> int:
        return len(self._lanes)

    def depth(self, lane: Hashable) -> int:
        queued = self._lanes.get(lane)
        return 0 if queued is None else len(queued)

    def has_room(self, lane: Hashable) -> bool:
        return self._size < self.capacity and self.depth(lane) < self.per_lane

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
        if not self._lanes:
            return None
        lane, queued = next(iter(self._lanes.items()))
        item = queued.popleft()
        self._size -= 1
        if queued:
            self._lanes.move_to_end(lane)
        else:
            del self._lanes[lane]
        return item
