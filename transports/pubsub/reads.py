"""Reads served from one buffer, and yamux credit returned every half window: the transport half of the lean path.

py-libp2p 0.8.1 reads small things with a call each, and each call is expensive:

- **Noise** reads every frame as a 2-byte length, then the body (`io/msgio.py` `read_msg`), each a `receive_some`
  on the socket: two syscalls and two scheduler passes per frame. `BufferedNoiseTransport` hands the handshake (and
  so the session built on it) a view of the raw connection whose reads are served from one 64 KiB socket read.
  Nothing else reads that connection once Noise has it (`security/noise/transport.py`, `secure_inbound/outbound`).
- **Pubsub** reads each RPC's varint length one byte at a time (`utils/varint.py`) and then the body, each a
  `NetStream.read` -> `YamuxStream.read` -> `Yamux.read_stream` with two locks, and each followed by yamux's credit
  logic. `BufferedReader` serves those reads from one read of whatever yamux holds (up to 64 KiB); yamux returns
  what it has without waiting for the whole request (`Yamux.read_stream`).
- **Yamux credit**: for small reads upstream's "partial slack" and "release on read" branches send a WINDOW_UPDATE
  after nearly every read, under `window_lock` (`YamuxStream._auto_tune_and_send_window_update`): 7.3 WINDOW_UPDATE
  frames per pubsub message received, measured. `batch_credit(stream)` switches a pubsub stream's YamuxStream to a
  subclass that returns the credit once half the initial window has been read (go-yamux's rule), taking no lock
  when it sends nothing. It keeps `transports.hardening.yamux`'s window cap: the class it switches to derives from
  the class the hardened session gave the stream. The window is not auto-tuned on these streams (pubsub RPCs are
  small and bounded; 256 KiB in flight is plenty).

Each upstream behaviour relied on is pinned in tests/test_pubsub_pins.py.
"""

from __future__ import annotations

from typing import Any

from libp2p.abc import IRawConnection, ISecureConn
from libp2p.peer.id import ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import DEFAULT_WINDOW_SIZE, YamuxStream

from transports.hardening.yamux import CappedWindowStream

READ_CHUNK = 64 * 1024
# Credit goes back once this much has been read: half the initial window, as go-yamux (`sendWindowUpdate`).
CREDIT_BATCH = DEFAULT_WINDOW_SIZE // 2


class _Buffered:
    """Reads of `n` bytes served from one buffer, refilled by a single `read(READ_CHUNK)` of the wrapped object; every
    other attribute is the wrapped object's. Returns what the buffer holds, up to `n`, as a stream read does."""

    __slots__ = ("_data", "_inner", "_pos")

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._data = b""
        self._pos = 0

    async def read(self, n: int | None = None) -> bytes:
        if self._pos >= len(self._data):
            self._data = await self._inner.read(READ_CHUNK)
            self._pos = 0
            if not self._data:
                return b""
        end = len(self._data) if n is None or n < 0 else min(self._pos + n, len(self._data))
        out = self._data[self._pos : end]
        self._pos = end
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class BufferedReader(_Buffered):
    """The stream pubsub reads from. Pubsub also uses the stream's `muxed_conn`, `metric_send_channel` and `reset`,
    which are the stream's own."""


class BufferedRawConnection(_Buffered):
    """A raw connection as Noise sees it. `write`, `close`, `get_remote_address`, `is_initiator` are its own."""


class BufferedNoiseTransport(NoiseTransport):
    """Noise (`/noise`, XX), its handshake and session reading the socket through one buffer."""

    async def secure_inbound(self, conn: IRawConnection) -> ISecureConn:
        return await super().secure_inbound(BufferedRawConnection(conn))  # type: ignore[arg-type]

    async def secure_outbound(self, conn: IRawConnection, peer_id: ID) -> ISecureConn:
        return await super().secure_outbound(BufferedRawConnection(conn), peer_id)  # type: ignore[arg-type]


class _BatchedCredit(YamuxStream):
    async def _auto_tune_and_send_window_update(self, *, bytes_read: int = 0) -> None:
        self._pending_recv_release += bytes_read
        if self._pending_recv_release < CREDIT_BATCH:
            return  # no await above: no other task ran between the two lines
        delta, self._pending_recv_release = self._pending_recv_release, 0
        self.recv_window += delta
        await self.send_window_update(delta, skip_lock=True)


class BatchedCreditStream(_BatchedCredit, CappedWindowStream):
    """A stream of a hardened session (`BoundedYamux`), crediting every half window."""


class BatchedCreditYamuxStream(_BatchedCredit, YamuxStream):
    """A stream of a stock yamux session, crediting every half window."""


_SWITCH: dict[type, type] = {CappedWindowStream: BatchedCreditStream, YamuxStream: BatchedCreditYamuxStream}


def batch_credit(stream: Any) -> bool:
    """Switch the yamux stream under a NetStream to half-window credit, before anything is read from it. False (and
    nothing changed) when it is not a yamux stream we know."""
    muxed = getattr(stream, "muxed_stream", None)
    switched = _SWITCH.get(type(muxed))
    if switched is None:
        return False
    muxed.__class__ = switched
    return True
