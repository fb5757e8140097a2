"""The swarm's inbound path, fixed and guarded: subclasses of py-libp2p 0.8.1's `Swarm` that change two methods.

**The inbound-slot leak.** Every accepted socket takes a slot of the swarm's inbound limiter
(`max_connections - min_connections`, 250 by default) in `Swarm._handle_inbound_connection`, released when
`_do_handle_inbound_connection` returns. Upstream's handler upgrades the socket and then parks on
`self.manager.wait_finished()`, the lifetime of the *swarm*: every inbound connection ever accepted holds its slot
until the node stops, and after 250 of them the node refuses everyone. The handler cannot simply return either:
`trio.serve_listeners` closes the socket when its handler returns. `ConnectionScopedSwarm` parks it on the
lifetime of *its own connection* instead.

**The rcmgr scope leak.** When `ConnectionLimits` refuses a connection in `add_conn`, upstream closes the muxer but
never the resource scope the upgrade attached to it, so rcmgr's connection counter ratchets up by one per refusal.
`ConnectionScopedSwarm.add_conn` releases it.

**Admission.** `GuardedSwarm` puts `SourceAdmission` in front of the upgrade (per-source concurrency and rate, a cap
on pending handshakes) and reports every refusal on the inbound path, its own and those of the handshake and of
rcmgr, to `Refusals`. Because its handler lives exactly as long as its connection, the per-source count is released
exactly when the connection ends -- which a `ConnectionGate` could not do: it is asked `is_allowed`, never told
about the close.

**Banned peers** (`transports.hardening.penalties`): once the handshake has named the peer, `GuardedSwarm.add_conn`
refuses a connection of a peer its `penalties` has banned, inbound or outbound, before it is registered (no
notifee, so no pubsub or identify stream ever opens on it), and counts `peer_banned`.

**The end of the stream during the handshake** raises at once (`HandshakeStream`), instead of upstream's 100 empty
reads, so that a socket closed mid-handshake costs what any refusal costs.

The swarm is built by `new_host`, which takes no swarm class, so `install_guarded_swarm` swaps the class of the
not-yet-running swarm (only methods differ, no state is added by `__init__`). `tests/test_hardening_inbound.py`
pins the upstream code this relies on.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import trio
from libp2p.abc import IHost, IMuxedConn
from libp2p.io.abc import ReadWriteCloser
from libp2p.io.exceptions import ConnectionClosedError
from libp2p.metrics.swarm import SwarmEvent
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.network.exceptions import SwarmException
from libp2p.network.swarm import Swarm
from libp2p.rcmgr import Direction
from libp2p.rcmgr.exceptions import ResourceLimitExceeded
from multiaddr import Multiaddr

from transports.hardening.admission import SourceAdmission, Ticket
from transports.hardening.penalties import PenaltyBox
from transports.hardening.refusals import Refusal, Refusals
from transports.hardening.shutdown import close_sockets_now

log = logging.getLogger(__name__)

# Closing a stranger's connection to make room: bounded, the valued peer's handshake waits on it.
EVICT_TIMEOUT = 2.0

# A held socket whose client sends more than this is closed: no handshake opening is this long.
_HELD_READ_LIMIT = 16 * 1024
# How often to look at a muxer that has no `event_closed` (py-libp2p's Yamux has one; this is for other muxers).
_CLOSED_POLL_INTERVAL = 0.5


async def wait_closed(muxed: IMuxedConn) -> None:
    """Until `muxed` is closed, by either side. Yamux sets `event_closed` on every path that closes it."""
    event = getattr(muxed, "event_closed", None)
    if isinstance(event, trio.Event):
        await event.wait()
        return
    while not muxed.is_closed:
        await trio.sleep(_CLOSED_POLL_INTERVAL)


class PeerBanned(SwarmException):
    """The connection's peer is banned for invalid messages (its refusal is counted where this is raised)."""


def classify_upgrade_failure(exc: BaseException) -> Refusal | None:
    """Which refusal an exception out of `Swarm.upgrade_inbound_raw_conn` stands for.

    The swarm wraps every cause in a `SwarmException`; the cause itself is chained (`raise ... from`) or is the
    exception being handled when it was raised (`__context__`). rcmgr's own denials carry no cause, only their
    message. `tests/test_hardening_inbound.py` produces each of these on a real host.
    """
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < 16:
        chain.append(current)
        current = current.__cause__ or current.__context__
    if any(isinstance(e, PeerBanned) for e in chain):
        return None  # counted by the gate that refused it
    if any(isinstance(e, ResourceLimitExceeded) for e in chain):
        return Refusal.CONNECTION_LIMIT
    if any(isinstance(e, trio.TooSlowError) for e in chain) or "upgrade timeout" in str(exc):
        return Refusal.HANDSHAKE_TIMEOUT
    message = str(exc)
    if "Connection denied by resource manager" in message and "pre-upgrade" not in message:
        # Refused once the PeerID is known: with the global counter out of reach and no circuit breaker or CIDR
        # limits configured, that is the per-peer connection rate.
        return Refusal.PEER_RATE
    if "denied by resource manager" in message or "Maximum connections limit reached" in message:
        return Refusal.CONNECTION_LIMIT
    return Refusal.HANDSHAKE_FAILED


def _release_scope(muxed_conn: IMuxedConn) -> None:
    scope = getattr(muxed_conn, "_resource_scope", None)
    close = getattr(scope, "close", None)
    if callable(close):
        try:
            close()  # idempotent: a ConnectionScope remembers that it is closed
        except Exception:
            log.debug("releasing a refused connection's rcmgr scope failed", exc_info=True)


async def _close_quietly(closer: Any) -> None:
    try:
        await closer.close()
    except Exception:
        pass  # already closed by the side that failed


class HandshakeStream(ReadWriteCloser):
    """An accepted socket as the upgrade sees it: during the handshake, the end of the stream raises at once.

    Upstream's `read_exactly` answers an empty read by reading again, 100 times, each a pass of the scheduler, before
    it gives up: every socket that closes mid-handshake (an idle attacker's socket evicted, or hanging up) cost about
    3 ms of CPU, and a few hundred of them a second saturated the node. Once the handshake is over it is the socket
    itself again (the muxer above relies on upstream's end-of-stream behaviour).
    """

    def __init__(self, inner: ReadWriteCloser) -> None:
        self.inner = inner
        self.handshaking = True

    async def read(self, n: int | None = None) -> bytes:
        data = await self.inner.read(n)
        if not data and n != 0 and self.handshaking:
            raise ConnectionClosedError("the peer closed the connection during the handshake", transport="tcp")
        return data

    async def write(self, data: bytes) -> None:
        await self.inner.write(data)

    async def close(self) -> None:
        await self.inner.close()

    def get_remote_address(self) -> tuple[str, int] | None:
        return self.inner.get_remote_address()

    def __getattr__(self, name: str) -> Any:  # anything else the transport's stream offers
        return getattr(self.inner, name)


class ConnectionScopedSwarm(Swarm):
    """A Swarm whose inbound handler lives as long as its connection, and whose refusals release their rcmgr scope."""

    async def _do_handle_inbound_connection(
        self, read_write_closer: ReadWriteCloser, maddr: Multiaddr, failure_event: SwarmEvent
    ) -> None:
        if isinstance(read_write_closer, IMuxedConn):  # QUIC, WebTransport: not used by us; upstream path unchanged
            await super()._do_handle_inbound_connection(read_write_closer, maddr, failure_event)
            return
        upgraded = await self._upgrade_inbound(read_write_closer, maddr)
        if isinstance(upgraded, IMuxedConn):
            await wait_closed(upgraded)  # upstream: `await self.manager.wait_finished()`

    async def _upgrade_inbound(
        self, read_write_closer: ReadWriteCloser, maddr: Multiaddr
    ) -> IMuxedConn | Exception | None:
        """Gate, then upgrade (bounded by `inbound_upgrade_timeout`). The connection; or, with its socket closed,
        the exception the upgrade failed with, or None when the connection gate refused the address."""
        remote = self._build_remote_multiaddr(read_write_closer)
        if remote is not None and not await self.connection_gate.is_allowed(remote):
            await _close_quietly(read_write_closer)
            return None
        stream = HandshakeStream(read_write_closer)
        raw_conn = RawConnection(stream, False)
        try:
            return await self.upgrade_inbound_raw_conn(raw_conn, maddr)
        except Exception as exc:
            log.debug("inbound upgrade from %s failed: %s", remote, exc)
            await _close_quietly(raw_conn)
            return exc
        finally:
            stream.handshaking = False

    async def add_conn(self, muxed_conn: IMuxedConn, direction: str = "unknown") -> Any:
        try:
            return await super().add_conn(muxed_conn, direction)
        except BaseException:
            _release_scope(muxed_conn)
            raise


def _abort_handshake(read_write_closer: ReadWriteCloser) -> None:
    """Close the socket under a handshake, synchronously: the handshake's next read sees EOF and fails the way any
    broken handshake does (upstream's cleanup runs), instead of being cancelled half-way through it (trio wakes the
    task blocked on the socket: `notify_closing`)."""
    close_sockets_now([read_write_closer])


class GuardedSwarm(ConnectionScopedSwarm):
    """`ConnectionScopedSwarm` with admission by source in front of every inbound handshake, and every refusal on
    the inbound path reported."""

    admission: SourceAdmission
    refusals: Refusals
    penalties: PenaltyBox
    # Peers worth a place even when the inbound connections are full (for a node: the offerers it has served), and
    # peers whose connection must not be closed to make one (for a node: those its connection manager never trims).
    # Set by the node.
    valued: Callable[[str], bool]
    busy: Callable[[], set[str]]
    evicted: int

    async def add_conn(self, muxed_conn: IMuxedConn, direction: str = "unknown") -> Any:
        peer = muxed_conn.peer_id.to_base58()
        if self.penalties.banned(peer):
            self.refusals(Refusal.PEER_BANNED)
            _release_scope(muxed_conn)
            await _close_quietly(muxed_conn)
            raise PeerBanned(f"peer {peer} is banned for invalid messages")
        if direction == "inbound" and self._inbound_full() and self.valued(peer):
            await self._make_room_for(peer)
        return await super().add_conn(muxed_conn, direction)

    def _inbound(self) -> list[Any]:
        """Established inbound connections, oldest first (the connection table keeps insertion order)."""
        return [
            c
            for conns in self.connections.values()
            for c in conns
            if getattr(c, "direction", None) == Direction.INBOUND
        ]

    def _inbound_full(self) -> bool:
        lifecycle = getattr(self._resource_manager, "connection_lifecycle", None)
        limit = getattr(getattr(lifecycle, "limits", None), "max_established_inbound", None)
        return limit is not None and len(self._inbound()) >= limit

    async def _make_room_for(self, peer: str) -> None:
        """Close the newest inbound connection of a stranger not in `busy` (nothing in progress, not a bootstrap peer or
        relay), so that a valued peer is not refused because strangers hold every place (a crowd of fresh keys can fill
        them in seconds, and before this the honest offerer dialling afresh was refused `connection_limit` now and
        then). No stranger to close: the valued peer is refused like anyone."""
        keep = self.busy()
        for conn in reversed(self._inbound()):
            other = conn.muxed_conn.peer_id.to_base58()
            if other == peer or other in keep or self.valued(other):
                continue
            with trio.CancelScope(shield=True), trio.move_on_after(EVICT_TIMEOUT):
                await _close_quietly(conn)
            self.evicted += 1
            log.info("closed a stranger's connection to make room for %s", peer)
            return

    async def _do_handle_inbound_connection(
        self, read_write_closer: ReadWriteCloser, maddr: Multiaddr, failure_event: SwarmEvent
    ) -> None:
        if isinstance(read_write_closer, IMuxedConn):
            await super()._do_handle_inbound_connection(read_write_closer, maddr, failure_event)
            return
        remote = read_write_closer.get_remote_address()
        ticket = self.admission.admit(remote[0] if remote else None)
        if not isinstance(ticket, Ticket):
            self.refusals(ticket)
            await self._hold_refused(read_write_closer)
            await _close_quietly(read_write_closer)
            return
        try:
            ticket.on_evict = functools.partial(_abort_handshake, read_write_closer)
            try:
                upgraded = await self._upgrade_inbound(read_write_closer, maddr)
            finally:
                ticket.handshake_done()
            if ticket.evicted and not isinstance(upgraded, IMuxedConn):
                self.refusals(Refusal.PENDING_FULL)
            elif upgraded is None:
                self.refusals(Refusal.GATED)
            elif isinstance(upgraded, Exception):
                reason = classify_upgrade_failure(upgraded)
                if reason is not None:
                    self.refusals(reason)
            else:
                await wait_closed(upgraded)
        finally:
            ticket.release()

    async def _hold_refused(self, read_write_closer: ReadWriteCloser) -> None:
        """Keep a refused socket open for a while (see `admission`), reading and dropping what its client sends
        (a libp2p dialer speaks first), until the hold time is over, or the client hangs up or sends more than a
        handshake would, or at once when too many are held."""
        if not self.admission.hold():
            return
        try:
            with trio.move_on_after(self.admission.limits.hold_seconds):
                dropped = 0
                while dropped <= _HELD_READ_LIMIT:
                    data = await read_write_closer.read(4096)
                    if not data:
                        break
                    dropped += len(data)
        except Exception:
            pass  # reset by the client: nothing left to hold
        finally:
            self.admission.unhold()


def install_guarded_swarm(
    host: IHost, admission: SourceAdmission, refusals: Refusals, penalties: PenaltyBox | None = None
) -> GuardedSwarm:
    """Make `host`'s swarm (built by `new_host`, not yet running) a `GuardedSwarm`."""
    swarm = host.get_network()
    if type(swarm) is not Swarm:
        raise TypeError(f"expected py-libp2p's own Swarm, got {type(swarm).__name__}")
    swarm.__class__ = GuardedSwarm
    assert isinstance(swarm, GuardedSwarm)
    swarm.admission = admission
    swarm.refusals = refusals
    swarm.penalties = penalties or PenaltyBox()
    swarm.valued = lambda peer: False
    swarm.busy = set
    swarm.evicted = 0
    return swarm
