"""Peers told to wait after a `busy` answer, and what their offers cost until they do: an I/O-free state machine.

A direct offer refused `busy` or `rate_limited` tells its peer when to try again (`retryAfterMs`). Until then, the
node has nothing new to say to that peer about work, so each offer it sends before its hold-off ends is refused
`rate_limited` without being parsed or verified (`transports.direct`): an offerer that floods with work the
node has no room for pays for its own streams, not for the node's signature checks. Each such early offer is also a
fraction of a strike on the host's `PenaltyBox`: a peer that ignores the hint again and again (with the defaults,
46 early offers in a burst, as the decayed sum passes nine strikes) is banned and cut off like one sending invalid
frames. An offerer that
waits as told is never refused early and never struck.

The hold-off is by PeerID, the Noise-authenticated sender of the stream, not by offerer key: one connection that
rotates offerer keys (a Sybil flood on one link) is held off as one peer. Memory is bounded: at most `max_tracked`
peers, the one held off longest ago forgotten first.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HoldoffLimits:
    # Long enough that a flooding sender's next offers land inside it, short enough that an honest offerer who waits
    # as told is back before the node's two workers have finished a typical short job.
    retry_after_s: float = 0.5
    # Each offer sent inside its hold-off: a fifth of a strike (`PenaltyLimits.strikes` is 10): 46 in a burst ban.
    strike_weight: float = 0.2
    max_tracked: int = 10_000

    def __post_init__(self) -> None:
        if self.retry_after_s <= 0 or self.strike_weight < 0:
            raise ValueError("retry_after_s must be positive and strike_weight not negative")
        if self.max_tracked < 1:
            raise ValueError("max_tracked must be at least 1")


class BusyHoldoff:
    def __init__(self, limits: HoldoffLimits | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits or HoldoffLimits()
        self._clock = clock
        self._until: OrderedDict[str, float] = OrderedDict()  # peer -> its hold-off ends (clock)

    @property
    def retry_after_ms(self) -> int:
        return round(self.limits.retry_after_s * 1000)

    def hold(self, peer: str) -> None:
        """`peer` was just refused for want of room: it should send nothing new for `retry_after_s`."""
        self._until.pop(peer, None)
        self._until[peer] = self._clock() + self.limits.retry_after_s
        while len(self._until) > self.limits.max_tracked:
            self._until.popitem(last=False)

    def remaining(self, peer: str) -> float:
        """Seconds left of `peer`'s hold-off; 0.0 when it has none (an expired one is forgotten)."""
        until = self._until.get(peer)
        if until is None:
            return 0.0
        left = until - self._clock()
        if left > 0:
            return left
        del self._until[peer]
        return 0.0

    def __len__(self) -> int:
        return len(self._until)
