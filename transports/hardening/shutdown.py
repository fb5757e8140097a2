"""A host shutdown bounded by a grace period, instead of about 0.2 s per connection.

Where py-libp2p 0.8.1's time goes: `Swarm.close` closes connections one after another, and each `SwarmConn.close`
pays two fixed sleeps -- `Yamux.close` ends with `trio.sleep(0.1)` after it has written GO_AWAY, closed the socket
and run `on_close`, and `SwarmConn._cleanup` sleeps 0.1 s again before notifying `disconnected`. A one-shot
`edgecoder offer` spent 218 ms in `host.close()`; a node with N peers spends N x 0.2 s.

`close_fast` closes every connection at once and waits only until each muxer reports `event_closed` (set right
after GO_AWAY is written and the socket closed), at most `grace` seconds; then it cancels what is left, which is
only those sleeps and the `disconnected` notifications of a host that is going away. A connection that did not get
that far in time (its peer stopped reading, so GO_AWAY cannot be written) has its socket closed directly. The
`SwarmConn`s are marked closed as the first thing `close` does, so the `host.close()` that follows skips them and
only closes the listeners and stops the swarm's tasks. Peers see the disconnect as before: the socket is closed.
However the close ends (an exception in it included), it finishes by closing every connection's socket that is
still open, synchronously (`close_sockets_now`): no descriptor is left for the garbage collector to find.
"""

from __future__ import annotations

import logging
from typing import Any

import trio
from libp2p.abc import IHost

log = logging.getLogger(__name__)

DEFAULT_GRACE = 0.5


async def close_fast(host: IHost, *, grace: float = DEFAULT_GRACE) -> None:
    """Close every connection of `host` concurrently (at most `grace` seconds), then the host itself."""
    conns = connections_of(host)
    try:
        await _close_all(host, conns, grace)
    finally:
        # However the close ended (cut short by the caller's bound included), no socket outlives it: one left to
        # the garbage collector is a descriptor held until it runs, then a ResourceWarning.
        close_sockets_now(conns + connections_of(host))


def connections_of(host: IHost) -> list[Any]:
    return [conn for conns in list(host.get_network().connections.values()) for conn in conns]


def close_sockets_now(conns: list[Any]) -> int:
    """Close the TCP socket under each of `conns` that is still open, synchronously; how many were."""
    closed = 0
    for conn in conns:
        stream = socket_stream_under(conn)
        if stream is not None and stream.socket.fileno() != -1:
            stream.socket.close()
            closed += 1
    return closed


def socket_stream_under(conn: Any) -> trio.SocketStream | None:
    """The trio stream at the bottom of a connection: SwarmConn, muxer, secure session, Noise reader-writer, raw
    connection and libp2p's TCP stream each hold the next. None for another transport."""
    layer = conn
    for _ in range(10):
        if isinstance(layer, trio.SocketStream):
            return layer
        below = (getattr(layer, name, None) for name in ("muxed_conn", "secured_conn", "conn", "read_writer", "stream"))
        layer = next((b for b in below if b is not None and b is not layer), None)
        if layer is None:
            return None
    return None


async def _close_all(host: IHost, conns: list[Any], grace: float) -> None:
    with trio.CancelScope(shield=True):
        with trio.move_on_after(grace):
            async with trio.open_nursery() as nursery:
                for conn in conns:
                    nursery.start_soon(_close_quietly, conn)
                for conn in conns:
                    closed = getattr(conn.muxed_conn, "event_closed", None)
                    if isinstance(closed, trio.Event):
                        await closed.wait()
                nursery.cancel_scope.cancel()  # what remains is libp2p's sleeps and our own notifications
        close_sockets_now(conns)  # those whose peer stopped reading: GO_AWAY could not be written in the grace
        await host.close()


async def _close_quietly(conn: Any) -> None:
    try:
        await conn.close()
    except Exception:
        log.debug("closing a connection failed", exc_info=True)  # its socket is closed after the grace
