"""Admission of inbound sockets by source address, before a byte is read: an I/O-free state machine.

When a socket is accepted:

- **live connections per source** (pending and established) are capped: one address cannot take every slot;
- **new connections per source per second** are a token bucket: one address cannot make the node spend its CPU on
  handshakes, and a key that reconnects from it is slowed too (libp2p's own per-peer rate needs a PeerID, which
  only exists after the handshake, and fresh keys cost nothing);
- **pending handshakes**, from everyone, are capped; when they are full, the *oldest* one is dropped to make room.
  A silent socket grows old; an honest handshake takes milliseconds. Refusing the newcomer instead would let an
  attacker with more addresses than the cap lock everyone out for a whole handshake timeout; with eviction it must
  open more than `max_pending` sockets within one honest handshake time to push an honest peer out.

A refused socket is not closed at once: it is **held** open for `hold_seconds` (what its client sends is read and
dropped; the hold ends early when the client hangs up), up to `max_held` of them. A client that reopens every
socket the node closes would otherwise turn each refusal into another accept, and a few hundred sockets into a
flood of thousands a second; held, they cost an fd and a parked task each.

A source is an IPv4 address, or an IPv6 /64: a single host is routinely given a whole /64, so counting per IPv6
address would let it take as many slots as it likes. IPv4-mapped IPv6 addresses count as their IPv4 address.

Every admitted socket gets a `Ticket`. The caller registers how to abort its handshake (`on_evict`), and reports
the end of the handshake and the end of the connection on it; each report is idempotent, so the counters cannot
drift whatever path a connection takes.
"""

from __future__ import annotations

import ipaddress
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from transports.hardening.refusals import Refusal

UNKNOWN_SOURCE = "?"  # a transport that reports no remote address: all such sockets share one budget


def source_key(ip: str | None) -> str:
    """The budget an address belongs to: the IPv4 address itself, or the /64 of an IPv6 address."""
    if not ip:
        return UNKNOWN_SOURCE
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])  # drop an IPv6 zone index
    except ValueError:
        return UNKNOWN_SOURCE
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr)


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    # Pending handshakes are cheap (an fd and a parked task each) and last at most the handshake timeout: the cap is
    # generous, so that evictions (and the reconnects they provoke) start only past a thousand silent sockets.
    max_pending: int = 1024
    max_per_source: int = 16
    source_rate: float = 10.0  # new connections per second from one source, sustained
    source_burst: float = 40.0  # and in a burst
    max_held: int = 1024  # refused sockets held open at once
    hold_seconds: float = 3.0
    # Token buckets are kept for at most this many sources (least recently seen forgotten first), so that a sweep
    # of addresses costs bounded memory. A forgotten source starts again with a full bucket.
    max_tracked_sources: int = 10_000

    def __post_init__(self) -> None:
        if self.max_pending < 1 or self.max_per_source < 1 or self.max_tracked_sources < 1:
            raise ValueError("admission limits must allow at least one connection")
        if self.source_rate <= 0 or self.source_burst < 1:
            raise ValueError("a source's rate must be positive and its burst at least 1")
        if self.max_held < 0 or self.hold_seconds < 0:
            raise ValueError("max_held and hold_seconds cannot be negative")


class Ticket:
    """One admitted socket. `handshake_done` and `release` are idempotent."""

    __slots__ = ("_admission", "_released", "evicted", "on_evict", "source")

    def __init__(self, admission: SourceAdmission, source: str) -> None:
        self._admission = admission
        self.source = source
        self._released = False
        self.evicted = False  # its handshake was dropped to make room for a newer one
        self.on_evict: Callable[[], None] | None = None  # aborts the handshake; set by whoever runs it

    @property
    def pending(self) -> bool:
        return self in self._admission._pending

    def handshake_done(self) -> None:
        self._admission._pending.pop(self, None)

    def release(self) -> None:
        """The connection is gone (or never got past its handshake)."""
        self.handshake_done()
        if not self._released:
            self._released = True
            self._admission._drop_live(self.source)

    def _evict(self) -> None:
        self.evicted = True
        self.handshake_done()
        if self.on_evict is not None:
            self.on_evict()


class SourceAdmission:
    def __init__(self, limits: AdmissionLimits, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._pending: dict[Ticket, None] = {}  # oldest first
        self._held = 0
        self._live: Counter[str] = Counter()
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # source -> (tokens, at)

    @property
    def pending(self) -> int:
        """Handshakes in progress."""
        return len(self._pending)

    def live(self, source: str) -> int:
        """Admitted connections from `source` (a `source_key`) that are not released yet."""
        return self._live[source]

    @property
    def held(self) -> int:
        """Refused sockets being held open."""
        return self._held

    def hold(self) -> bool:
        """Whether a refused socket may be held open (then `unhold` it when it is closed), or must be closed now."""
        if self._held >= self.limits.max_held:
            return False
        self._held += 1
        return True

    def unhold(self) -> None:
        self._held -= 1

    @property
    def sources(self) -> int:
        """Sources with live connections."""
        return len(self._live)

    @property
    def tracked_sources(self) -> int:
        """Sources whose token bucket is remembered."""
        return len(self._buckets)

    def admit(self, ip: str | None) -> Ticket | Refusal:
        """A ticket for a socket from `ip`, or the reason it must be closed now. When the pending handshakes are
        full, the oldest is evicted first (its `on_evict` runs before this returns)."""
        source = source_key(ip)
        if self._live[source] >= self.limits.max_per_source:
            return Refusal.SOURCE_CONCURRENCY
        if not self._take_token(source):
            return Refusal.SOURCE_RATE
        while len(self._pending) >= self.limits.max_pending:
            next(iter(self._pending))._evict()
        ticket = Ticket(self, source)
        self._pending[ticket] = None
        self._live[source] += 1
        return ticket

    def _take_token(self, source: str) -> bool:
        now = self._clock()
        limits = self.limits
        tokens, at = self._buckets.pop(source, (limits.source_burst, now))
        tokens = min(limits.source_burst, tokens + max(0.0, now - at) * limits.source_rate)
        admitted = tokens >= 1.0
        self._buckets[source] = (tokens - 1.0 if admitted else tokens, now)  # now the most recently seen
        while len(self._buckets) > limits.max_tracked_sources:
            self._buckets.popitem(last=False)
        return admitted

    def _drop_live(self, source: str) -> None:
        self._live[source] -= 1
        if self._live[source] <= 0:
            del self._live[source]
