"""A yamux session that bounds what one peer can make the node hold: py-libp2p 0.8.1's Yamux, three rules stricter.

1. **The receive window is enforced.** Upstream appends a DATA frame to the stream's buffer first and checks the
   window after, and on a violation only logs and clamps (`Yamux.handle_incoming`, for DATA, SYN and ACK frames):
   600 MB pushed past a 256 KiB window took a node from 94 MB to 701 MB. go-yamux answers the same thing with a
   protocol-error GO_AWAY; so do we, before a single byte past the credit is stored.
2. **A stream's window auto-tunes up to 1 MiB**, not 16 MiB: a peer that respects flow control can make us buffer
   at most that much per stream its handler is slow to read.
3. **Inbound streams per connection are capped** (upstream bounds only the streams *we* open): past the cap a new
   stream is reset at once.

The hook for all three: Yamux creates every stream's buffer by assignment into `stream_buffers` (in `open_stream`
and in `handle_incoming`, each right after registering the stream in `streams`) and grows it only with `.extend()`,
before it charges the window. `BoundedYamux.stream_buffers` is a dict that wraps each new buffer so that `extend`
checks the credit the peer actually had; the same assignment is where a new stream is counted and its window capped.

`muxer_opt={"/yamux/1.0.0": BoundedYamux}` is not enough: `MuxerMultistream.new_conn` constructs the stock `Yamux`
whenever yamux is negotiated, whatever class it was given. `install_bounded_yamux` gives the host's upgrader a
selector that builds ours. `tests/test_hardening_yamux.py` pins the upstream code this relies on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.abc import IHost, IMuxedConn, ISecureConn
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.stream_muxer.muxer_multistream import MuxerMultistream
from libp2p.stream_muxer.yamux.yamux import (
    DEFAULT_WINDOW_SIZE,
    GO_AWAY_PROTOCOL_ERROR,
    MAX_WINDOW_SIZE,
    Yamux,
    YamuxStream,
)
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID

from transports.hardening.refusals import Refusal, Refusals

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StreamLimits:
    max_inbound_streams: int = 64  # streams the remote peer may hold open on one connection
    # A stream's receive window starts at 256 KiB and doubles while its reader keeps up, up to this. It must be
    # 256 KiB x 2^k, so that doubling lands on it exactly.
    max_stream_window: int = 1 << 20

    def __post_init__(self) -> None:
        if self.max_inbound_streams < 1:
            raise ValueError("a connection must be allowed at least one inbound stream")
        window = self.max_stream_window
        if not DEFAULT_WINDOW_SIZE <= window <= MAX_WINDOW_SIZE or window % DEFAULT_WINDOW_SIZE:
            raise ValueError(f"max_stream_window must be 256 KiB x 2^k, at most 16 MiB; got {window}")
        if (window // DEFAULT_WINDOW_SIZE) & (window // DEFAULT_WINDOW_SIZE - 1):
            raise ValueError(f"max_stream_window must be 256 KiB x 2^k; got {window}")

    @property
    def buffered_per_connection(self) -> int:
        """The most one window-respecting peer can make us buffer on one connection."""
        return self.max_inbound_streams * self.max_stream_window


class CappedWindowStream(YamuxStream):
    """A YamuxStream whose receive window auto-tunes only up to its connection's `max_stream_window`."""

    conn: BoundedYamux

    def _apply_autotune_epoch(self, buffered: int) -> int:
        if self.target_recv_window >= self.conn.limits.max_stream_window:
            self.epoch_start = trio.current_time()  # what upstream does when it decides not to grow
            return 0
        return super()._apply_autotune_epoch(buffered)


class _WindowedBuffer(bytearray):
    """A stream's receive buffer that refuses data past the credit the peer was given."""

    __slots__ = ("conn", "stream_id")

    def __init__(self, initial: Any, conn: BoundedYamux, stream_id: int) -> None:
        super().__init__(initial)
        self.conn = conn
        self.stream_id = stream_id

    def extend(self, data: Any) -> None:
        stream = self.conn.streams.get(self.stream_id)
        credit = stream.recv_window if stream is not None else 0
        if len(data) > credit:
            self.conn.window_violated(self.stream_id, len(data), credit)
            return  # not one byte past the window is kept
        super().extend(data)


class _StreamBuffers(dict[int, bytearray]):
    """`Yamux.stream_buffers`: every new stream passes through `__setitem__`, after it is in `conn.streams`."""

    def __init__(self, conn: BoundedYamux) -> None:
        super().__init__()
        self.conn = conn

    def __setitem__(self, stream_id: int, value: bytearray) -> None:
        super().__setitem__(stream_id, _WindowedBuffer(value, self.conn, stream_id))
        stream = self.conn.streams.get(stream_id)
        if stream is not None:
            self.conn.stream_added(stream)


class BoundedYamux(Yamux):
    def __init__(
        self,
        secured_conn: ISecureConn,
        peer_id: ID,
        *,
        is_initiator: bool | None = None,
        limits: StreamLimits,
        refusals: Refusals,
    ) -> None:
        super().__init__(secured_conn, peer_id, is_initiator=is_initiator)
        self.limits = limits
        self.refusals = refusals
        self.stream_buffers = _StreamBuffers(self)
        self.violated = False
        self._refused_streams: set[int] = set()  # reset by us, not yet finalized

    def stream_added(self, stream: YamuxStream) -> None:
        if type(stream) is YamuxStream:  # Yamux builds its streams itself; only a method differs
            stream.__class__ = CappedWindowStream
        if not stream.is_initiator:
            self._admit_inbound(stream)

    def _admit_inbound(self, stream: YamuxStream) -> None:
        live = sum(
            1
            for s in self.streams.values()
            if not s.is_initiator and not s.closed and s.stream_id not in self._refused_streams
        )
        if live <= self.limits.max_inbound_streams or self._nursery is None:
            return
        self._refused_streams.add(stream.stream_id)
        self.refusals(Refusal.STREAM_CAP)
        self._nursery.start_soon(self._reset_refused, stream)

    async def _reset_refused(self, stream: YamuxStream) -> None:
        try:
            await stream.reset()
        except Exception:
            pass  # the session is closing: the stream goes with it
        finally:
            self._refused_streams.discard(stream.stream_id)

    def window_violated(self, stream_id: int, length: int, credit: int) -> None:
        if self.violated:
            return  # one violation closes the session; what is still in flight is dropped
        self.violated = True
        self.refusals(Refusal.WINDOW_VIOLATION)
        log.info(
            "peer %s sent %d bytes on stream %d with %d bytes of window: closing the session",
            self.peer_id,
            length,
            stream_id,
            credit,
        )
        if self._nursery is not None:
            self._nursery.start_soon(self._close_for_violation)

    async def _close_for_violation(self) -> None:
        # Shielded: closing the socket ends handle_incoming, whose exit cancels this very nursery; unshielded, the
        # close would stop before `on_close` tells the SwarmConn, which would then list a dead connection.
        with trio.CancelScope(shield=True):
            await self.close(GO_AWAY_PROTOCOL_ERROR)


class BoundedMuxerMultistream(MuxerMultistream):
    """The upgrader's muxer selector, building a `BoundedYamux` when yamux is negotiated."""

    def __init__(self, limits: StreamLimits, refusals: Refusals, negotiate_timeout: int) -> None:
        super().__init__({TProtocol(YAMUX_PROTOCOL_ID): BoundedYamux}, negotiate_timeout)
        self.limits = limits
        self.refusals = refusals

    async def new_conn(self, conn: ISecureConn, peer_id: ID) -> IMuxedConn:
        protocol, transport_class = await self._selector.select(conn, conn.is_initiator, self.negotiate_timeout)
        muxed: IMuxedConn
        if protocol == YAMUX_PROTOCOL_ID:
            muxed = BoundedYamux(
                conn, peer_id, is_initiator=conn.is_initiator, limits=self.limits, refusals=self.refusals
            )
        else:
            muxed = transport_class(conn, peer_id)
        return self._annotate_connection(muxed, conn, protocol)


def install_bounded_yamux(host: IHost, limits: StreamLimits, refusals: Refusals) -> None:
    """Make every new connection of `host` (not yet running) a `BoundedYamux` session."""
    upgrader = host.get_network().upgrader  # type: ignore[attr-defined]
    current = upgrader.muxer_multistream
    if list(current.transports) != [TProtocol(YAMUX_PROTOCOL_ID)]:
        raise TypeError(f"expected a yamux-only host, got muxers {list(current.transports)}")
    upgrader.muxer_multistream = BoundedMuxerMultistream(limits, refusals, current.negotiate_timeout)
