"""One control stream per peer: claims, results, statuses and aborts multiplexed on a stream that stays open.

Opening a libp2p stream costs 7.3-7.8 ms of CPU here (yamux SYN, multistream-select both ways, the handler task),
against 1.6-2.0 ms for the same exchange on a stream that is already open; a gossip offer makes two (the claim, the
result), and presence one per status change. So each node keeps, for its own requests to a peer, one long-lived
`/edgecoder/control/1.0.0` stream, and the peer answers on it. Each request carries an `id` and each answer the `re`
of its request, so requests to one peer run concurrently (at most `MAX_IN_FLIGHT` per stream):

    {"id": 7, "type": "claim", "offerId": bin(16), "status": {...}}  ->  {"re": 7, "type": "grant"}
    {"id": 8, "type": "result", "result": bin}                       ->  {"re": 8, "type": "ack"}
    {"id": 9, "type": "status"}                        ->  {"re": 9, "type": "status", "heartbeat": {...}}
    {"id": 10, "type": "presence", "status": {...}}                  ->  {"re": 10, "type": "ack"}
    {"id": 11, "type": "abort", "offerId": bin(16)}                  ->  {"re": 11, "type": "ack"}
    any of them                                        ->  {"re": n, "type": "refusal", "reason", "detail"}

The messages, their bounds and their refusals are those of the one-exchange protocols (`transports.direct`), which
stay served for peers that do not speak this one: a request whose control stream cannot be opened falls back to
them. A control stream that fails (the connection dropped, a malformed answer) fails its pending requests as
`unreachable` and is opened afresh by the next request.

Direct offers keep their own stream: its end is how an offerer that stops waiting aborts the run.

Both ends read a control stream as pubsub streams are read (`PubsubTuning.control_reads`, `buffered`): through one
buffer, so that a frame (a 1-byte read, the rest of its length, its body) is one read of what yamux holds instead of
three, each taking yamux's locks (a scheduler turn each), and with yamux credit returned every half window instead of
a WINDOW_UPDATE after nearly every read. A claim and its grant cross a busy node in fewer turns.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from libp2p.abc import INetStream
from libp2p.io.exceptions import IOException

from transports.framing import FrameError, FrameFault, read_frame, write_frame
from transports.p2p import DialError, P2PHost
from transports.pubsub.reads import BufferedReader, batch_credit
from transports.pubsub.tuning import PubsubTuning
from transports.wire.codec import pack, unpack_strict
from transports.wire.reasons import Reason, Rejected, Rejection

log = logging.getLogger(__name__)

CONTROL_PROTOCOL = "/edgecoder/control/1.0.0"
# Requests one peer may have waiting on one stream; a reader past it waits (yamux's window then holds the sender).
MAX_IN_FLIGHT = 16
# How long a peer that did not negotiate the control protocol is asked the old way without trying again.
LEGACY_FOR_S = 600.0
WRITE_TIMEOUT = 5.0

# The server side: (request type, request map, the sender's PeerID) -> the answer map (without `re`).
Dispatch = Callable[[str, dict[str, Any], str], Awaitable[dict[str, Any]]]


def buffered(stream: INetStream, tuning: PubsubTuning) -> Any:
    """The control stream as both ends read it (see the module docstring); call it before reading from it. Writes,
    resets and the connection are the stream's own."""
    if not tuning.control_reads:
        return stream
    batch_credit(stream)
    return BufferedReader(stream)


def _remote_peer(stream: INetStream) -> str:
    return str(stream.muxed_conn.peer_id.to_base58())


async def read_next_frame(stream: INetStream, *, max_len: int, frame_timeout: float) -> bytes:
    """The next frame of a long-lived stream: it may take any time to start, then must arrive whole within
    `frame_timeout` (a peer that trickles a frame holds nothing for long)."""
    try:
        first = await stream.read(1)
    except IOException as exc:  # StreamEOF, StreamReset: the peer closed the stream or the connection went
        raise FrameError(FrameFault.CLOSED, f"stream ended between frames ({type(exc).__name__})") from None
    if not first:
        raise FrameError(FrameFault.CLOSED, "stream ended between frames")
    return await read_frame(_Prefixed(first, stream), max_len=max_len, timeout=frame_timeout)


class _Prefixed:
    """A stream with one byte already read back in front of it."""

    def __init__(self, head: bytes, stream: INetStream) -> None:
        self._head = head
        self._stream = stream

    async def read(self, n: int) -> bytes:
        if self._head:
            out, self._head = self._head[:n], self._head[n:]
            return out
        return await self._stream.read(n)


@dataclass
class _Pending:
    done: trio.Event = field(default_factory=trio.Event)
    answer: dict[str, Any] | Rejection | None = None


class _Channel:
    """Our requests to one peer on one stream, and the reader that matches the answers to them."""

    def __init__(self, peer_id: str, stream: INetStream, max_answer: int) -> None:
        self.peer_id = peer_id
        self.stream = stream
        self.max_answer = max_answer
        self.pending: dict[int, _Pending] = {}
        self.ids = itertools.count(1)
        self.write_lock = trio.Lock()
        self.slots = trio.Semaphore(MAX_IN_FLIGHT)
        self.closed = False

    async def read_answers(self, frame_timeout: float) -> None:
        why = "the control stream closed"
        try:
            while True:
                frame = await read_next_frame(self.stream, max_len=self.max_answer, frame_timeout=frame_timeout)
                answer = unpack_strict(frame, max_size=self.max_answer)
                re = answer.get("re") if isinstance(answer, dict) else None
                pending = self.pending.get(re) if type(re) is int else None
                if pending is None:
                    why = "the peer answered a request it was not asked"
                    return
                pending.answer = answer
                pending.done.set()
        except (FrameError, Rejected) as exc:
            why = f"the control stream failed: {exc}"
        except Exception as exc:  # yamux and the stream raise their own types once the connection is gone
            why = f"the control stream failed: {type(exc).__name__}"
        finally:
            self.fail_all(why)
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                try:
                    await self.stream.reset()
                except Exception:
                    pass

    def fail_all(self, why: str) -> None:
        self.closed = True
        for pending in self.pending.values():
            if not pending.done.is_set():
                pending.answer = Rejection(Reason.UNREACHABLE, why)
                pending.done.set()

    async def call(self, message: dict[str, Any], timeout: float) -> dict[str, Any] | Rejection:
        async with self.slots:
            request_id = next(self.ids)
            pending = self.pending[request_id] = _Pending()
            try:
                try:
                    async with self.write_lock:
                        with trio.fail_after(WRITE_TIMEOUT):
                            await write_frame(self.stream, pack({**message, "id": request_id}))
                except (Exception, trio.TooSlowError) as exc:
                    self.fail_all(f"could not write to the control stream: {type(exc).__name__}")
                    return Rejection(Reason.UNREACHABLE, f"could not send to {self.peer_id}")
                with trio.move_on_after(timeout):
                    await pending.done.wait()
                if pending.answer is None:
                    return Rejection(Reason.TIMEOUT, f"no answer from {self.peer_id} in {timeout:g} s")
                return pending.answer
            finally:
                del self.pending[request_id]


class ControlChannels:
    """This node's control streams, one per peer, opened on first use; their readers run in `run`'s nursery."""

    def __init__(self, host: P2PHost, *, max_answer: int, frame_timeout: float) -> None:
        self.host = host
        self.max_answer = max_answer
        self.frame_timeout = frame_timeout
        self._channels: dict[str, _Channel] = {}
        self._opening: dict[str, trio.Lock] = {}
        self._legacy: dict[str, float] = {}  # peer -> until when it is asked the old way
        self._nursery: trio.Nursery | None = None
        self.opened = 0

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None
                for channel in self._channels.values():
                    channel.fail_all("the node is stopping")

    async def request(self, peer: str, message: dict[str, Any], *, timeout: float) -> dict[str, Any] | Rejection | None:
        """The peer's answer map, a typed rejection, or None when this peer is to be asked the old way (it does not
        speak the control protocol, or the node is not running its channels)."""
        channel = await self._channel(peer)
        if channel is None:
            return None
        return await channel.call(message, timeout)

    async def _channel(self, peer: str) -> _Channel | None:
        if self._nursery is None:
            return None
        try:
            peer_id = await self.host.ensure_connected(peer)
        except DialError:
            return None  # the old way dials again and reports `unreachable` with the reason
        if self._legacy.get(peer_id, 0.0) > trio.current_time():
            return None
        channel = self._channels.get(peer_id)
        if channel is not None and not channel.closed:
            return channel
        lock = self._opening.setdefault(peer_id, trio.Lock())
        async with lock:
            channel = self._channels.get(peer_id)
            if channel is not None and not channel.closed:
                return channel
            try:
                stream = await self.host.open_stream(peer_id, CONTROL_PROTOCOL)
            except DialError:
                if peer_id in self.host.connected_peers():  # connected, so it is the protocol it does not speak
                    self._legacy[peer_id] = trio.current_time() + LEGACY_FOR_S
                return None
            finally:
                if not lock.statistics().tasks_waiting:
                    self._opening.pop(peer_id, None)
            nursery = self._nursery
            if nursery is None:
                await stream.reset()
                return None
            channel = _Channel(peer_id, buffered(stream, self.host.tuning), self.max_answer)
            self._channels[peer_id] = channel
            self.opened += 1
            nursery.start_soon(self._read, channel)
            return channel

    async def _read(self, channel: _Channel) -> None:
        try:
            await channel.read_answers(self.frame_timeout)
        finally:
            if self._channels.get(channel.peer_id) is channel:
                del self._channels[channel.peer_id]


async def serve_control(
    stream: INetStream,
    dispatch: Dispatch,
    *,
    max_request: Callable[[str], int],
    max_frame: int,
    frame_timeout: float,
    on_invalid: Callable[[Rejection], Awaitable[None]] | None = None,
) -> None:
    """Answer a peer's requests on its control stream until it closes it. Each request is decided in a task of its
    own (at most `MAX_IN_FLIGHT` at once); `max_request(type)` bounds each type as its own protocol does.
    `on_invalid` hears of every frame refused as invalid (not msgpack, malformed, over its type's cap), after the
    refusal is sent: the host's penalties count them as they count those of the per-exchange protocols."""
    sender = _remote_peer(stream)
    write_lock = trio.Lock()
    slots = trio.Semaphore(MAX_IN_FLIGHT)

    async def answer(re: int | None, message: dict[str, Any]) -> None:
        async with write_lock:
            with trio.fail_after(WRITE_TIMEOUT):
                await write_frame(stream, pack({**message, "re": re}))

    async def decide(re: int, kind: str, request: dict[str, Any]) -> None:
        try:
            await answer(re, await dispatch(kind, request, sender))
        except (Exception, trio.TooSlowError):
            log.debug("control request from %s not answered", sender, exc_info=True)
        finally:
            slots.release()

    async with trio.open_nursery() as nursery:
        while True:
            await slots.acquire()
            try:
                frame = await read_next_frame(stream, max_len=max_frame, frame_timeout=frame_timeout)
            except FrameError:
                slots.release()
                break  # closed, reset, oversized or trickled: the stream is done (its requests still answer)
            try:
                request = unpack_strict(frame, max_size=max_frame)
            except Rejected as rejected:
                slots.release()
                await _refuse(answer, None, rejected.rejection, on_invalid)
                break  # a frame that is not msgpack leaves nothing to answer by id
            re = request.get("id") if isinstance(request, dict) else None
            kind = request.get("type") if isinstance(request, dict) else None
            if type(re) is not int or not isinstance(kind, str) or not isinstance(request, dict):
                slots.release()
                malformed = Rejection(Reason.MALFORMED, "expected {id: int, type: str, ...}")
                await _refuse(answer, None, malformed, on_invalid)
                break
            if len(frame) > max_request(kind):
                slots.release()
                too_large = Rejection(Reason.TOO_LARGE, f"a {kind[:16]} request of {len(frame)} bytes")
                await _refuse(answer, re, too_large, on_invalid)
                continue
            nursery.start_soon(decide, re, kind, request)


async def _refuse(
    answer: Callable[[int | None, dict[str, Any]], Awaitable[None]],
    re: int | None,
    why: Rejection,
    on_invalid: Callable[[Rejection], Awaitable[None]] | None,
) -> None:
    try:
        await answer(re, {"type": "refusal", "reason": str(why.reason), "detail": why.detail[:512]})
    except (Exception, trio.TooSlowError):
        pass
    if on_invalid is not None:
        await on_invalid(why)
