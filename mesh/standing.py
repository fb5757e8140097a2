"""An offerer's standing with this node: established (the operator trusts it, or this node has served it) or fresh.

Fresh keys cost nothing to make, so a swarm of them (a Sybil flood) can always outnumber one honest offerer; one lane
per key cannot help against that. What a new key cannot have is history with this node. The intake therefore keeps
part of its queue and of its workers for established offerers (see `mesh.fairqueue.ClassQueue`):

- **trusted**: the operator's lists (`IntakePolicy.trusted_offerers`, and every key of `allow_offerers`);
- **earned**: an offerer this node has served (ran one of its offers in a container and answered it) over at least
  `tenure_s` (ten minutes by default): served once, then again at least that long after the first time. So a key
  made for an attack is fresh for its first ten minutes here, and a one-key flood stays in the fresh class while it
  floods. Promotion is also paid for by the node's own work, which fresh offerers get only within their share, and
  it is rate limited node-wide (`promotions_per_hour`, with a burst), so a Sybil swarm that waits out the tenure
  still joins the established class slowly however many keys it makes. The earned set is bounded (`capacity`,
  least recently served forgotten first), and so are the candidates (fresh offerers served once, with the time).

With a `journal` the earned set survives restarts: each promotion appends the 32-byte key (a plain `write`, no
fsync), and the file is rewritten with the live set on load and once it holds twice `capacity` records.
I/O-free apart from that journal; time is injected (monotonic seconds).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import structlog

from mesh.journal import RecordJournal
from mesh.limits import RateLimiter

log = structlog.get_logger("edgecoder.standing")

KEY_SIZE = 32
_PROMOTIONS = "promotions"  # the one key of the node-wide promotion bucket


class Standing:
    def __init__(
        self,
        *,
        trusted: frozenset[bytes] = frozenset(),
        capacity: int = 10_000,
        tenure_s: float = 600.0,
        promotions_per_hour: float = 60.0,
        promotion_burst: float = 16.0,
        monotonic: Callable[[], float],
        journal: Path | None = None,
    ) -> None:
        if capacity < 1 or tenure_s < 0:
            raise ValueError("the earned set needs room for at least one offerer, and a tenure of 0 s or more")
        self.trusted = trusted
        self.capacity = capacity
        self.tenure_s = tenure_s
        self._monotonic = monotonic
        self._promotions = RateLimiter(promotions_per_hour / 3600, promotion_burst, max_keys=1)
        self._earned: OrderedDict[bytes, None] = OrderedDict()  # least recently served first
        self._candidates: OrderedDict[bytes, float] = OrderedDict()  # fresh offerer -> when first served
        self.promoted = 0  # promotions since start, and promotions the budget deferred: for metrics and tests
        self.deferred = 0
        self._journal = None if journal is None else RecordJournal(journal, KEY_SIZE, "standing")
        if self._journal is not None:
            self._load(self._journal)

    def __len__(self) -> int:
        return len(self._earned)

    def established(self, offerer: bytes) -> bool:
        return offerer in self.trusted or offerer in self._earned

    def served(self, offerer: bytes) -> bool:
        """This node ran one of `offerer`'s offers and answered it. True when that made it established."""
        if offerer in self.trusted:
            return False
        if offerer in self._earned:
            self._earned.move_to_end(offerer)
            return False
        now = self._monotonic()
        first = self._candidates.setdefault(offerer, now)
        self._candidates.move_to_end(offerer)
        if len(self._candidates) > self.capacity:
            self._candidates.popitem(last=False)
        if now - first < self.tenure_s:
            return False
        if not self._promotions.allow(_PROMOTIONS, now):
            self.deferred += 1  # it stays fresh; a later run may promote it when the budget has refilled
            return False
        del self._candidates[offerer]
        self._earned[offerer] = None
        if len(self._earned) > self.capacity:
            self._earned.popitem(last=False)
        self.promoted += 1
        if self._journal is not None and self._journal.append(offerer) and self._journal.records > 2 * self.capacity:
            self._journal.rewrite(b"".join(self._earned))
        return True

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()

    # -- the journal -------------------------------------------------------------------------------------------

    def _load(self, journal: RecordJournal) -> None:
        data = journal.read()
        for start in range(0, len(data), KEY_SIZE):
            key = data[start : start + KEY_SIZE]
            self._earned.pop(key, None)
            self._earned[key] = None
        while len(self._earned) > self.capacity:
            self._earned.popitem(last=False)
        journal.rewrite(b"".join(self._earned))
        if self._earned:
            log.info("established offerers restored", offerers=len(self._earned), path=str(journal.path))
