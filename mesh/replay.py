"""Replay memory: the (offerer, offer id) pairs of admitted offers, kept until the clock check would refuse them anyway.

Three rules make it safe against the offerers it protects:

- **An id is spent only on admission.** The intake asks `seen()` early (cheap), but calls `spend()` only once the
  offer has passed every check and is in the queue. An offer refused `busy`, `rate_limited` or
  `sandbox_unavailable` can be sent again.
- **Each offerer has its own share** (`per_offerer` entries), so one key's flood never touches another's ids, and
  when the whole memory is full (`capacity`), new offers are refused (`has_room()` is False, the intake answers
  `busy`) instead of an unexpired id being forgotten. Forgetting early is what let a captured offer in again.
- **Entries expire by the offer's own clock**: an id is forgotten once its offer's `expiresAt` plus the allowed
  skew has passed, which is exactly when the clock check starts refusing it.

With a `journal` path the memory survives restarts: each spent id is appended as one fixed-size record (offerer,
id, forget-at) with a plain `write` (no fsync: it survives a crash of the process, not a power cut), and the file is
compacted on load and whenever it holds twice as many records as are live. Memory: about 200 bytes an entry.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Callable
from pathlib import Path

import structlog

from mesh.journal import RecordJournal

log = structlog.get_logger("edgecoder.replay")

_RECORD = struct.Struct(">32s16sQ")  # offerer public key, offer id, forget at (wall-clock ms)


class ReplayMemory:
    def __init__(
        self,
        *,
        per_offerer: int,
        capacity: int,
        now_ms: Callable[[], int],
        journal: Path | None = None,
    ) -> None:
        if per_offerer < 1 or capacity < per_offerer:
            raise ValueError("replay memory needs 1 <= per_offerer <= capacity")
        self.per_offerer = per_offerer
        self.capacity = capacity
        self._now_ms = now_ms
        self._by_offerer: dict[bytes, dict[bytes, int]] = {}
        self._expiry: list[tuple[int, bytes, bytes]] = []  # heap of (forget at, offerer, id)
        self._size = 0
        self._journal = None if journal is None else RecordJournal(journal, _RECORD.size, "replay")
        if self._journal is not None:
            self._load(self._journal)

    def __len__(self) -> int:
        self._expire()
        return self._size

    def seen(self, offerer: bytes, offer_id: bytes) -> bool:
        self._expire()
        ids = self._by_offerer.get(offerer)
        return ids is not None and offer_id in ids

    def has_room(self, offerer: bytes) -> bool:
        """Whether `offerer` may spend one more id now, without anything unexpired being forgotten."""
        self._expire()
        return self._size < self.capacity and len(self._by_offerer.get(offerer, ())) < self.per_offerer

    def spend(self, offerer: bytes, offer_id: bytes, forget_at_ms: int) -> None:
        """Remember an admitted offer's id. The caller has checked `has_room` and `seen` (no await in between)."""
        self._insert(offerer, offer_id, forget_at_ms)
        if self._journal is not None:
            self._append(self._journal, _RECORD.pack(offerer, offer_id, forget_at_ms))

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()

    # -- internals ---------------------------------------------------------------------------------------------

    def _insert(self, offerer: bytes, offer_id: bytes, forget_at_ms: int) -> None:
        ids = self._by_offerer.setdefault(offerer, {})
        if offer_id not in ids:
            self._size += 1
        ids[offer_id] = forget_at_ms
        heapq.heappush(self._expiry, (forget_at_ms, offerer, offer_id))

    def _expire(self) -> None:
        now = self._now_ms()
        heap = self._expiry
        while heap and heap[0][0] <= now:
            forget_at, offerer, offer_id = heapq.heappop(heap)
            ids = self._by_offerer.get(offerer)
            if ids is None or ids.get(offer_id) != forget_at:
                continue  # superseded by a later spend of the same id
            del ids[offer_id]
            self._size -= 1
            if not ids:
                del self._by_offerer[offerer]

    def _load(self, journal: RecordJournal) -> None:
        now = self._now_ms()
        for offerer, offer_id, forget_at in _RECORD.iter_unpack(journal.read()):
            if forget_at > now:
                self._insert(offerer, offer_id, forget_at)
        self._compact(journal)
        if self._size:
            log.info("replay memory restored", entries=self._size, path=str(journal.path))

    def _compact(self, journal: RecordJournal) -> None:
        """Rewrite the journal with the live entries only."""
        self._expire()
        journal.rewrite(
            b"".join(
                _RECORD.pack(offerer, offer_id, forget_at)
                for offerer, ids in self._by_offerer.items()
                for offer_id, forget_at in ids.items()
            )
        )

    def _append(self, journal: RecordJournal, record: bytes) -> None:
        if not journal.append(record) or journal.records % 1024:
            return
        self._expire()
        if journal.records > 2 * self._size + 1024:
            self._compact(journal)
