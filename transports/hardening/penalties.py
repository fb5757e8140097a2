"""Peers penalised for invalid messages, and banned for a while past a threshold: an I/O-free state machine.

A peer earns a *strike* for each invalid thing it sends on a direct stream (a frame over its cap, a malformed
request, a bad signature: `transports.direct`); strikes decay with a half-life, and the `strikes`-th strike of a
burst bans the peer for `ban_seconds` (the decayed sum has passed `strikes - 1`: with the defaults, ten invalid
frames within about 9 s, while one every 10 s or more never adds up to a ban). GossipSub keeps its own score
(`transports.pubsub.scoring`) and bans through `ban` when that score falls below the graylist threshold. One ban
list serves both, and everything that consults it refuses the peer while the ban lasts: the swarm refuses its
connections, in either direction (the gate in `GuardedSwarm.add_conn`, counted as `peer_banned`), pubsub drops its
RPCs and resets its streams, the direct transport resets its streams.

A ban is by PeerID, which costs an attacker nothing to replace: a fresh key starts with no strikes. What a fresh key
does cost is a full handshake, and those are bounded per source address by admission (`transports.hardening.
admission`): an attacker with one address gets at most its connection rate in fresh identities, each allowed
`strikes` invalid messages (or the ~50 of the gossip score) before it is cut off.

Memory is bounded: at most `max_tracked` peers with strikes and `max_banned` bans (the least recently struck and
the oldest ban are forgotten first).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PenaltyLimits:
    # An honest peer never sends an invalid frame on purpose; a bug or a flaky link might, now and then. Ten within
    # about a minute is not that.
    strikes: float = 10.0
    half_life: float = 60.0  # seconds for a strike to count half
    ban_seconds: float = 600.0
    max_tracked: int = 10_000
    max_banned: int = 10_000

    def __post_init__(self) -> None:
        if self.strikes <= 0 or self.half_life <= 0 or self.ban_seconds <= 0:
            raise ValueError("strikes, half_life and ban_seconds must be positive")
        if self.max_tracked < 1 or self.max_banned < 1:
            raise ValueError("max_tracked and max_banned must be at least 1")


class PenaltyBox:
    def __init__(self, limits: PenaltyLimits | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits or PenaltyLimits()
        self._clock = clock
        self._strikes: OrderedDict[str, tuple[float, float]] = OrderedDict()  # peer -> (strikes, at)
        self._banned: OrderedDict[str, float] = OrderedDict()  # peer -> ban ends (clock), oldest ban first

    def strikes(self, peer: str) -> float:
        """The peer's strikes now, decayed."""
        held = self._strikes.get(peer)
        return 0.0 if held is None else self._decayed(*held, self._clock())

    def strike(self, peer: str, weight: float = 1.0) -> bool:
        """One more strike against `peer`; True when this one banned it (False when it is banned already)."""
        if self.banned(peer):
            return False
        now = self._clock()
        held = self._strikes.pop(peer, None)
        total = weight + (0.0 if held is None else self._decayed(*held, now))
        if total > self.limits.strikes - 1:
            return self.ban(peer)
        self._strikes[peer] = (total, now)  # now the most recently struck
        while len(self._strikes) > self.limits.max_tracked:
            self._strikes.popitem(last=False)
        return False

    def ban(self, peer: str) -> bool:
        """Ban `peer` for `ban_seconds` from now; True when it was not banned already."""
        if self.banned(peer):
            return False
        self._strikes.pop(peer, None)
        self._banned[peer] = self._clock() + self.limits.ban_seconds
        while len(self._banned) > self.limits.max_banned:
            self._banned.popitem(last=False)
        return True

    def banned(self, peer: str) -> bool:
        ends = self._banned.get(peer)
        if ends is None:
            return False
        if self._clock() < ends:
            return True
        del self._banned[peer]  # served its time: it starts again with no strikes
        return False

    @property
    def active_bans(self) -> int:
        """Bans not yet known to have expired (an upper bound: expiry is noticed lazily)."""
        return len(self._banned)

    def _decayed(self, strikes: float, at: float, now: float) -> float:
        return strikes * math.pow(0.5, max(0.0, now - at) / self.limits.half_life)
