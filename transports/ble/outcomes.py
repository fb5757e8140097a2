"""What happened in each BLE session, kept for the node's logs and metrics and for tests to wait on."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import trio

from transports.base import Verdict
from transports.wire.reasons import Rejection


@dataclass(frozen=True, slots=True)
class SessionOutcome:
    address: str
    # The PeerID the peer advertised over GATT; unauthenticated, for logs only.
    advertised_peer_id: str | None = None
    # What the sink answered, when the offer got that far.
    verdict: Verdict | None = None
    # The transport's own failure (framing, timeout, disconnect), when there was one.
    fault: Rejection | None = None
    claimed: bool = False
    replied: bool = False
    connect_attempts: int = 0  # of the first connection
    reconnects: int = 0  # links re-established to finish the reply


class OutcomeLog:
    """A bounded log of session outcomes that Trio code can wait on. Trio-side only."""

    def __init__(self, keep: int = 256) -> None:
        self._items: collections.deque[SessionOutcome] = collections.deque(maxlen=keep)
        self._changed = trio.Event()
        self.total = 0

    def append(self, item: SessionOutcome) -> None:
        self._items.append(item)
        self.total += 1
        self._changed.set()
        self._changed = trio.Event()

    def __iter__(self) -> Iterator[SessionOutcome]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    async def wait_for(self, predicate: Callable[[list[SessionOutcome]], bool]) -> list[SessionOutcome]:
        while not predicate(list(self._items)):
            await self._changed.wait()
        return list(self._items)
