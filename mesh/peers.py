"""What this node knows of its peers: their latest heartbeat, authenticated by libp2p's pubsub signature."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SANDBOX_MODES = ("docker", "none")
MAX_TIERS = 4


@dataclass(frozen=True, slots=True)
class Heartbeat:
    peer_id: str
    sandbox_mode: str
    free_slots: int
    languages: tuple[str, ...]
    addrs: tuple[str, ...]
    seen_at: float
    # The sandbox tiers it runs offers under (`runc`, `gvisor`). A node from before tiers says nothing: runc.
    isolation: tuple[str, ...] = ("runc",)

    @classmethod
    def parse(cls, peer_id: str, data: Any, seen_at: float) -> Heartbeat | None:
        """A heartbeat that does not parse, or names another peer than its signer, is ignored."""
        if not isinstance(data, dict) or data.get("peerId") != peer_id:
            return None
        mode, slots = data.get("sandboxMode"), data.get("freeSlots")
        languages, addrs = data.get("languages", []), data.get("addrs", [])
        if mode not in SANDBOX_MODES or type(slots) is not int or slots < 0:
            return None
        if not isinstance(languages, list) or not all(isinstance(x, str) for x in languages[:8]):
            return None
        if not isinstance(addrs, list) or not all(isinstance(x, str) and len(x) < 256 for x in addrs[:8]):
            return None
        tiers = data.get("isolation", ["runc"] if mode == "docker" else [])
        if not isinstance(tiers, list) or not all(isinstance(x, str) and len(x) <= 16 for x in tiers[:MAX_TIERS]):
            return None
        return cls(peer_id, mode, slots, tuple(languages[:8]), tuple(addrs[:8]), seen_at, tuple(tiers[:MAX_TIERS]))


class PeerDirectory:
    """Bounded: at most `capacity` peers, and a heartbeat older than `stale_after` seconds counts for nothing.

    Kept in the order heartbeats were last seen, so that making room (the peer heard from longest ago goes) and
    listing the fresh ones cost O(1) per peer, not a scan of all of them.
    """

    def __init__(
        self, *, stale_after: float = 10.0, capacity: int = 10_000, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.stale_after = stale_after
        self.capacity = capacity
        self._monotonic = monotonic
        self._latest: OrderedDict[str, Heartbeat] = OrderedDict()
        self.ignored = 0

    def __len__(self) -> int:
        return len(self._latest)

    def observe(self, peer_id: str, data: Any) -> None:
        heartbeat = Heartbeat.parse(peer_id, data, self._monotonic())
        if heartbeat is None:
            self.ignored += 1
            return
        self._latest[peer_id] = heartbeat
        self._latest.move_to_end(peer_id)
        while len(self._latest) > self.capacity:
            self._latest.popitem(last=False)

    def forget(self, peer_id: str) -> None:
        self._latest.pop(peer_id, None)

    def get(self, peer_id: str) -> Heartbeat | None:
        heartbeat = self._latest.get(peer_id)
        if heartbeat is None or self._monotonic() - heartbeat.seen_at > self.stale_after:
            return None
        return heartbeat

    def sandbox_mode(self, peer_id: str) -> str | None:
        """`docker`, `none`, or None when no fresh heartbeat was seen."""
        heartbeat = self.get(peer_id)
        return None if heartbeat is None else heartbeat.sandbox_mode

    def fresh(self) -> list[Heartbeat]:
        """Fresh heartbeats, newest first: the walk stops at the first stale one."""
        now = self._monotonic()
        found = []
        for heartbeat in reversed(self._latest.values()):
            if now - heartbeat.seen_at > self.stale_after:
                break
            found.append(heartbeat)
        return found
