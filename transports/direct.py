"""Direct request/response streams between two peers: offers addressed to us, claims and results to the offerer.

Each exchange is one stream carrying one request frame and one answer frame (see `transports.framing`). Answers
are canonical msgpack maps:

    {"type": "result", "result": <signed result bytes>}     offer stream, after the work ran
    {"type": "grant"}                                        claim stream
    {"type": "ack"}                                          result and abort streams
    {"type": "refusal", "reason": <Reason>, "detail": str}   any stream

A job is bound to the request that brought it. On an offer stream the offerer may send one more frame while it
waits, `{"type": "abort"}`; that frame, the stream's end or reset, or the result timeout cancel the job's scope
(`Delivery.scope`), and the cancel reaches the container. A gossip offerer that stops waiting sends
`{"type": "abort", "offerId": id}` on the abort protocol to each peer holding its claim; only the offerer itself
(the Noise-authenticated PeerID of the stream) can abort its offers.

Every server handler is bounded in time (a stalled peer costs at most `stall_timeout`, an admitted offer at most
`result_timeout`), answers with a typed refusal where the stream still allows it, and never raises into libp2p.

A refusal for invalid input (`INVALID_INPUT`: a frame over its cap, a malformed request, a bad signature) is also a
strike against the peer on the host's `PenaltyBox`; past its threshold the peer is banned and cut off (counted as
`invalid_frames`), and while the ban lasts its streams are reset unread (`peer_banned`) and its connections refused.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import trio
from libp2p.abc import INetStream

from transports.base import Admitted, Delivery, OfferSink
from transports.control import CONTROL_PROTOCOL, ControlChannels, buffered, serve_control
from transports.framing import FrameError, FrameFault, read_frame, write_frame
from transports.hardening.holdoff import BusyHoldoff
from transports.hardening.refusals import Refusal
from transports.p2p import DialError, P2PHost
from transports.wire.codec import pack, unpack_strict
from transports.wire.offers import MAX_RESULT_BYTES, OFFER_ID_SIZE
from transports.wire.reasons import Reason, Rejected, Rejection

log = logging.getLogger(__name__)

OFFER_PROTOCOL = "/edgecoder/offer/1.0.0"
CLAIM_PROTOCOL = "/edgecoder/claim/1.0.0"
RESULT_PROTOCOL = "/edgecoder/result/1.0.0"
# A peer's current heartbeat, asked for point to point: an offerer that has not yet heard a claimant's flooded
# heartbeat asks it directly (over Noise, so the answer is authenticated) instead of waiting for the next one.
STATUS_PROTOCOL = "/edgecoder/status/1.0.0"
# The offerer of a gossip offer tells its claimant that it stopped waiting.
ABORT_PROTOCOL = "/edgecoder/abort/1.0.0"
# A node's status pushed to a neighbour when it changes (transports.presence); answered with an ack.
PRESENCE_PROTOCOL = "/edgecoder/presence/1.0.0"

# A signed result plus the answer map around it.
MAX_RESULT_FRAME = MAX_RESULT_BYTES + 1024
# A claim request or any answer other than a result: a type, an id, a reason and a short detail; a status with its
# addresses and the runners it reports.
MAX_CONTROL_FRAME = 8 * 1024
# Bounds a write to a peer that stopped reading (its yamux window is full).
WRITE_TIMEOUT = 5.0

# Refusals for want of room: the peer is told when to try again, and held off until then.
_NO_ROOM = frozenset({Reason.BUSY, Reason.RATE_LIMITED})
# A retry hint from a peer is believed up to an hour.
MAX_RETRY_AFTER_MS = 3_600_000

# A request that ends mid-frame is not a message; an answer that never arrives whole is a failed link.
_REQUEST_FRAME_REASONS = {
    FrameFault.TOO_LARGE: Reason.TOO_LARGE,
    FrameFault.TIMEOUT: Reason.TIMEOUT,
    FrameFault.CLOSED: Reason.MALFORMED,
}
_ANSWER_FRAME_REASONS = {
    FrameFault.TOO_LARGE: Reason.TOO_LARGE,
    FrameFault.TIMEOUT: Reason.TIMEOUT,
    # The stream closed or was reset before the answer: nobody answered, which is not the peer refusing. Gossip
    # then goes on to the offerer's other addresses.
    FrameFault.CLOSED: Reason.UNREACHABLE,
}
# An abort is one small frame, sent while the offerer is already giving up: it must not hold it for long.
ABORT_SEND_TIMEOUT = 1.0
# Asked whether a peer's offer with this id is pending here; True when one was cancelled.
AbortFn = Callable[[str, bytes], bool]
# Told of a status a neighbour pushed: (its PeerID, the status).
PresenceFn = Callable[[str, dict[str, Any]], object]
# Refusals that say the peer sent something invalid, whatever our policy and clock: each is a strike against it.
INVALID_INPUT = frozenset({Reason.TOO_LARGE, Reason.MALFORMED, Reason.BAD_SIGNATURE})


class OfferDesk(Protocol):
    """The offerer's side of claims and results. Implemented by `mesh.claims`."""

    async def grant_claim(
        self, offer_id: bytes, claimant: str, status: dict[str, Any] | None = None
    ) -> Rejection | None:
        """None grants the claim. `status` is the claimant's own, sent with its request."""
        ...

    async def accept_result(self, raw: bytes, sender: str) -> Rejection | None:
        """None acknowledges the result."""
        ...


@dataclass(frozen=True, slots=True)
class DirectAnswer:
    result: bytes | None
    refusal: Rejection | None


class ReplyError(Exception):
    """The result could not be written back: the offer stream timed out, closed, or was answered already."""


def refusal_message(rejection: Rejection) -> dict[str, Any]:
    message: dict[str, Any] = {"type": "refusal", "reason": str(rejection.reason), "detail": rejection.detail[:512]}
    if rejection.retry_after_ms is not None:
        message["retryAfterMs"] = rejection.retry_after_ms  # when this peer's next offer is looked at
    return message


def decode_answer(frame: bytes, expected: str) -> dict[str, Any] | Rejection:
    """The answer map of type `expected`, or the peer's refusal, or `malformed` for anything else."""
    try:
        answer = unpack_strict(frame, max_size=MAX_RESULT_FRAME)
    except Rejected as exc:
        return Rejection(Reason.MALFORMED, f"answer: {exc.rejection.detail}")
    return checked_answer(answer, expected)


def checked_answer(answer: Any, expected: str) -> dict[str, Any] | Rejection:
    """An answer map (decoded) of type `expected`, or the peer's refusal, or `malformed` for anything else."""
    if not isinstance(answer, dict):
        return Rejection(Reason.MALFORMED, "answer is not a map")
    kind = answer.get("type")
    if kind == "refusal":
        reason, detail, retry = answer.get("reason"), answer.get("detail", ""), answer.get("retryAfterMs")
        retry_ok = isinstance(retry, int) and not isinstance(retry, bool) and 0 < retry <= MAX_RETRY_AFTER_MS
        try:
            return Rejection(
                Reason(str(reason)), detail if isinstance(detail, str) else "", retry if retry_ok else None
            )
        except ValueError:
            return Rejection(Reason.MALFORMED, f"peer refused with an unknown reason {str(reason)[:64]!r}")
    if kind != expected:
        return Rejection(Reason.MALFORMED, f"expected a {expected!r} answer, got {str(kind)[:32]!r}")
    return answer


def decode_request(frame: bytes) -> dict[str, Any] | Rejection:
    """A control request map, or `malformed`."""
    try:
        request = unpack_strict(frame, max_size=MAX_CONTROL_FRAME)
    except Rejected as exc:
        return exc.rejection
    if not isinstance(request, dict):
        return Rejection(Reason.MALFORMED, "request is not a map")
    return request


def _remote_peer(stream: INetStream) -> str:
    return str(stream.muxed_conn.peer_id.to_base58())


async def _send(stream: INetStream, message: dict[str, Any]) -> bool:
    """Write one answer; False when the stream no longer takes writes (the peer left, or stopped reading)."""
    try:
        with trio.fail_after(WRITE_TIMEOUT):
            await write_frame(stream, pack(message))
    except (Exception, trio.TooSlowError):
        return False
    return True


async def _close(stream: INetStream) -> None:
    with trio.move_on_after(WRITE_TIMEOUT):
        try:
            await stream.close()
        except Exception:  # already reset by the peer: nothing left to close
            await stream.reset()


class _OfferExchange:
    """One admitted offer waiting for its result: `reply` writes it on the stream the offer came in on."""

    def __init__(self, stream: INetStream) -> None:
        self.stream = stream
        self.lock = trio.Lock()  # the reply and the timeout refusal must not interleave on the stream
        # Set once the result is written (or failed to be): only then may the handler close the stream.
        self.answered = trio.Event()
        self.replied = False
        self.expired = False

    async def reply(self, result: bytes) -> None:
        async with self.lock:
            if self.replied:
                raise ReplyError("this offer was answered already")
            if self.expired:
                raise ReplyError("the offerer's stream timed out before the result was ready")
            self.replied = True
            try:
                written = await _send(self.stream, {"type": "result", "result": result})
            finally:
                self.answered.set()
            if not written:
                raise ReplyError("the offerer's stream closed before the result could be written")

    async def expire(self) -> bool:
        """Refuse with `timeout` unless the result got there first; True when we refused."""
        async with self.lock:
            self.expired = True
            if self.replied:
                return False
            await _send(self.stream, refusal_message(Rejection(Reason.TIMEOUT, "no result in time")))
            return True


class DirectTransport:
    name = "direct"

    def __init__(
        self,
        host: P2PHost,
        desk: OfferDesk,
        *,
        max_frame: int = 256 * 1024 + 1024,
        stall_timeout: float = 10.0,
        result_timeout: float = 120.0,
        status: Callable[[], dict[str, Any]] | None = None,
        abort: AbortFn | None = None,
        presence: PresenceFn | None = None,
        holdoff: BusyHoldoff | None = None,
    ) -> None:
        self.host = host
        self.status = status
        self.abort = abort
        self.presence = presence
        self.sink: OfferSink | None = None  # set by run(): offers are refused until then
        self.desk = desk
        self.max_frame = max_frame
        self.stall_timeout = stall_timeout
        self.result_timeout = result_timeout
        # Refusals we sent, by reason, and handlers currently running (tests prove a stalled one is freed).
        self.refused: Counter[str] = Counter()
        self.active_handlers = 0
        # Peers with an exchange in progress here, by PeerID: the connection manager does not trim them.
        self.exchanges: Counter[str] = Counter()
        self.aborted = 0  # jobs cancelled because their offerer stopped waiting
        # Peers refused for want of room, until their retry hint runs out (transports.hardening.holdoff).
        self.holdoff = holdoff if holdoff is not None else BusyHoldoff()
        # Our requests to each peer, on one long-lived stream per peer (transports.control). Used while `run` runs;
        # the client methods fall back to a stream per exchange otherwise.
        self.control = ControlChannels(host, max_answer=MAX_CONTROL_FRAME, frame_timeout=stall_timeout)
        self.use_control = True

    async def run(self, sink: OfferSink, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the direct protocols until cancelled; the client methods work whether or not this runs."""
        handlers = {
            OFFER_PROTOCOL: self._serve_offer,
            CLAIM_PROTOCOL: self._serve_claim,
            RESULT_PROTOCOL: self._serve_result,
        }
        if self.status is not None:
            handlers[STATUS_PROTOCOL] = self._serve_status
        if self.abort is not None:
            handlers[ABORT_PROTOCOL] = self._serve_abort
        if self.presence is not None:
            handlers[PRESENCE_PROTOCOL] = self._serve_presence
        handlers[CONTROL_PROTOCOL] = self._serve_control
        self.sink = sink
        for protocol, serve in handlers.items():
            self.host.set_handler(protocol, self._guarded(serve))
        try:
            async with trio.open_nursery() as nursery:
                if self.use_control:
                    await nursery.start(self.control.run)
                task_status.started()
                await trio.sleep_forever()
        finally:
            for protocol in handlers:
                self.host.remove_handler(protocol)
            self.sink = None

    # -- server side -------------------------------------------------------------------------------------------

    def _guarded(self, serve: Callable[[INetStream], Awaitable[None]]) -> Callable[[INetStream], Awaitable[None]]:
        """Whatever happens in `serve`, libp2p sees a handler that returns, and the stream is closed."""

        async def handler(stream: INetStream) -> None:
            if self.host.banned(_remote_peer(stream)):
                self.host.refusals(Refusal.PEER_BANNED)
                with trio.move_on_after(WRITE_TIMEOUT):
                    await stream.reset()
                return
            peer = _remote_peer(stream)
            self.active_handlers += 1
            long_lived = serve == self._serve_control  # counted per request instead (`_dispatch`)
            if not long_lived:
                self.exchanges[peer] += 1
            try:
                await serve(stream)
            except Exception:
                log.exception("direct stream handler failed; resetting the stream")
                with trio.move_on_after(WRITE_TIMEOUT):
                    await stream.reset()
            finally:
                self.active_handlers -= 1
                if not long_lived:
                    self._exchange_ended(peer)
                await _close(stream)

        return handler

    async def _refuse(self, stream: INetStream, rejection: Rejection) -> None:
        self.refused[str(rejection.reason)] += 1
        await _send(stream, refusal_message(rejection))
        await self._strike_if_invalid(_remote_peer(stream), rejection)

    async def _refuse_early(self, stream: INetStream, peer: str) -> None:
        """An offer from a peer still inside its hold-off: refused unparsed and unverified, and a fraction of a
        strike."""
        self.host.refusals(Refusal.RETRY_TOO_SOON)
        rejection = Rejection(
            Reason.RATE_LIMITED,
            f"this peer was refused for want of room and sent again within {self.holdoff.retry_after_ms} ms; "
            "wait retryAfterMs before the next offer",
            retry_after_ms=max(1, math.ceil(self.holdoff.remaining(peer) * 1000)),
        )
        self.refused[str(rejection.reason)] += 1
        await _send(stream, refusal_message(rejection))
        if self.host.penalties.strike(peer, self.holdoff.limits.strike_weight):
            await self.host.cut_off(peer, Refusal.RETRY_IGNORED)

    async def _strike_if_invalid(self, peer: str, rejection: Rejection) -> None:
        if rejection.reason in INVALID_INPUT and self.host.penalties.strike(peer):
            await self.host.cut_off(peer, Refusal.INVALID_FRAMES)

    async def _read_request(self, stream: INetStream, max_len: int) -> bytes | None:
        try:
            return await read_frame(stream, max_len=max_len, timeout=self.stall_timeout)
        except FrameError as exc:
            await self._refuse(stream, Rejection(_REQUEST_FRAME_REASONS[exc.reason], exc.detail))
            return None

    async def _serve_offer(self, stream: INetStream) -> None:
        peer = _remote_peer(stream)
        raw = await self._read_request(stream, self.max_frame)
        if raw is None:
            return
        if self.holdoff.remaining(peer) > 0:  # read all the same, so that the peer's write completes and it hears why
            await self._refuse_early(stream, peer)
            return
        sink = self.sink
        if sink is None:
            await self._refuse(stream, Rejection(Reason.SHUTTING_DOWN, "this node is not serving offers"))
            return
        if not sink.participating:
            await self._refuse(stream, Rejection(Reason.SANDBOX_UNAVAILABLE, "this node is not taking offers"))
            return
        exchange = _OfferExchange(stream)
        delivery = Delivery(raw, "direct", sender=peer, reply=exchange.reply, direct=True)
        verdict = await sink.deliver(delivery)
        if not isinstance(verdict, Admitted):
            if verdict.reason in _NO_ROOM:
                self.holdoff.hold(peer)
                verdict = replace(verdict, retry_after_ms=self.holdoff.retry_after_ms)
            await self._refuse(stream, verdict)
            return
        async with trio.open_nursery() as nursery:
            # The offerer's side of the stream: an abort frame, or its end, means nobody waits for this job now
            # (the watcher then cancels the job and this whole wait).
            nursery.start_soon(self._watch_offerer, stream, delivery.scope, nursery.cancel_scope)
            with trio.move_on_after(self.result_timeout) as timer:
                await exchange.answered.wait()
            nursery.cancel_scope.cancel()
        if timer.cancelled_caught:
            delivery.scope.cancel()  # nobody will read a result after the timeout: stop the run
            if await exchange.expire():
                self.refused[str(Reason.TIMEOUT)] += 1

    async def _watch_offerer(self, stream: INetStream, job: trio.CancelScope, waiting: trio.CancelScope) -> None:
        try:
            frame = await read_frame(stream, max_len=MAX_CONTROL_FRAME, timeout=math.inf)
        except FrameError:
            frame = None  # closed or reset: the offerer went away
        if frame is not None:
            request = decode_request(frame)
            if not (isinstance(request, dict) and request.get("type") == "abort"):
                return  # anything else on an offer stream is noise; the job goes on
        self.aborted += 1
        job.cancel()
        waiting.cancel()

    # The one-exchange protocols: one request frame, one answer, on a stream of its own. Each decision is shared
    # with the control stream (`_dispatch`), so both answer alike.

    async def _serve_abort(self, stream: INetStream) -> None:
        request = await self._read_control(stream, "abort")
        if request is not None:
            await self._send_answer(stream, await self._decide_abort(request, _remote_peer(stream)))

    async def _read_control(self, stream: INetStream, kind: str) -> dict[str, Any] | None:
        """A `{type: kind, ...}` request map, or None once a refusal has been sent."""
        frame = await self._read_request(stream, MAX_CONTROL_FRAME)
        if frame is None:
            return None
        request = decode_request(frame)
        if isinstance(request, Rejection):
            await self._refuse(stream, request)
            return None
        return request

    async def _serve_claim(self, stream: INetStream) -> None:
        request = await self._read_control(stream, "claim")
        if request is not None:
            await self._send_answer(stream, await self._decide_claim(request, _remote_peer(stream)))

    async def _serve_result(self, stream: INetStream) -> None:
        raw = await self._read_request(stream, MAX_RESULT_FRAME)
        if raw is not None:
            await self._send_answer(stream, await self._decide_result(raw, _remote_peer(stream)))

    async def _serve_status(self, stream: INetStream) -> None:
        if await self._read_request(stream, MAX_CONTROL_FRAME) is not None:
            await self._send_answer(stream, self._decide_status())

    async def _serve_presence(self, stream: INetStream) -> None:
        request = await self._read_control(stream, "presence")
        if request is not None:
            await self._send_answer(stream, self._decide_presence(request, _remote_peer(stream)))

    async def _serve_control(self, stream: INetStream) -> None:
        await serve_control(
            buffered(stream, self.host.tuning),
            self._dispatch,
            max_request=lambda kind: MAX_RESULT_FRAME if kind == "result" else MAX_CONTROL_FRAME,
            max_frame=MAX_RESULT_FRAME,
            frame_timeout=self.stall_timeout,
            on_invalid=lambda why: self._control_refused(stream, why),
        )

    async def _control_refused(self, stream: INetStream, rejection: Rejection) -> None:
        self.refused[str(rejection.reason)] += 1
        await self._strike_if_invalid(_remote_peer(stream), rejection)

    async def _send_answer(self, stream: INetStream, answer: dict[str, Any]) -> None:
        if answer.get("type") == "refusal":
            self.refused[str(answer.get("reason"))] += 1
        await _send(stream, answer)

    # -- decisions: the same whether the request came on a stream of its own or on the control stream -----------

    def _exchange_ended(self, peer: str) -> None:
        self.exchanges[peer] -= 1
        if self.exchanges[peer] <= 0:
            del self.exchanges[peer]

    def peers_in_flight(self) -> set[str]:
        """Peers with an offer, claim, result or status exchange in progress on this node's side."""
        return set(self.exchanges)

    async def _dispatch(self, kind: str, request: dict[str, Any], sender: str) -> dict[str, Any]:
        self.exchanges[sender] += 1
        try:
            return await self._decide(kind, request, sender)
        finally:
            self._exchange_ended(sender)

    async def _decide(self, kind: str, request: dict[str, Any], sender: str) -> dict[str, Any]:
        if kind == "claim":
            answer = await self._decide_claim(request, sender)
        elif kind == "result":
            raw = request.get("result")
            answer = (
                await self._decide_result(raw, sender)
                if isinstance(raw, bytes)
                else refusal_message(Rejection(Reason.MALFORMED, "expected {type: result, result: bytes}"))
            )
        elif kind == "status" and self.status is not None:
            answer = self._decide_status()
        elif kind == "presence" and self.presence is not None:
            answer = self._decide_presence(request, sender)
        elif kind == "abort" and self.abort is not None:
            answer = await self._decide_abort(request, sender)
        else:
            answer = refusal_message(Rejection(Reason.MALFORMED, f"no such request here: {kind[:32]!r}"))
        if answer.get("type") == "refusal":
            self.refused[str(answer.get("reason"))] += 1
        return answer

    @staticmethod
    def _offer_id_of(request: dict[str, Any], kind: str) -> bytes | Rejection:
        offer_id = request.get("offerId") if request.get("type") == kind else None
        if not isinstance(offer_id, bytes) or len(offer_id) != OFFER_ID_SIZE:
            return Rejection(Reason.MALFORMED, f"expected {{type: {kind}, offerId: 16 bytes}}")
        return offer_id

    async def _decide_claim(self, request: dict[str, Any], sender: str) -> dict[str, Any]:
        offer_id = self._offer_id_of(request, "claim")
        if isinstance(offer_id, Rejection):
            return refusal_message(offer_id)
        status = request.get("status")
        decision = self.desk.grant_claim(offer_id, sender, status if isinstance(status, dict) else None)
        return await self._from_desk(decision, "grant")

    async def _decide_result(self, raw: bytes, sender: str) -> dict[str, Any]:
        return await self._from_desk(self.desk.accept_result(raw, sender), "ack")

    def _decide_status(self) -> dict[str, Any]:
        assert self.status is not None
        return {"type": "status", "heartbeat": self.status()}

    def _decide_presence(self, request: dict[str, Any], sender: str) -> dict[str, Any]:
        status = request.get("status") if request.get("type") == "presence" else None
        if not isinstance(status, dict):
            return refusal_message(Rejection(Reason.MALFORMED, "expected {type: presence, status: map}"))
        assert self.presence is not None
        self.presence(sender, status)  # a status naming another peer than the sender is ignored by the directory
        return {"type": "ack"}

    async def _decide_abort(self, request: dict[str, Any], sender: str) -> dict[str, Any]:
        offer_id = self._offer_id_of(request, "abort")
        if isinstance(offer_id, Rejection):
            return refusal_message(offer_id)
        assert self.abort is not None
        if self.abort(sender, offer_id):
            self.aborted += 1
            return {"type": "ack"}
        return refusal_message(Rejection(Reason.UNKNOWN_OFFER, "no pending offer of yours has that id here"))

    async def _from_desk(self, decision: Awaitable[Rejection | None], ok: str) -> dict[str, Any]:
        # The desk is local and should answer at once; the bound keeps a slow one from pinning the stream.
        with trio.move_on_after(self.stall_timeout):
            rejection = await decision
            return {"type": ok} if rejection is None else refusal_message(rejection)
        return refusal_message(Rejection(Reason.TIMEOUT, "the offerer did not decide in time"))

    # -- client side -------------------------------------------------------------------------------------------

    async def _exchange(
        self,
        peer: str,
        protocol: str,
        payload: bytes,
        expected: str,
        *,
        answer_timeout: float,
        max_answer: int,
        abort_frame: bytes | None = None,
    ) -> dict[str, Any] | Rejection:
        """Send one request frame and read one answer. A failed link is `unreachable`, never the peer's refusal.

        With `abort_frame`, a caller that stops waiting (its scope is cancelled: Ctrl-C, its own deadline) first
        sends that frame on the stream, so that the peer stops the work too.
        """
        try:
            peer_id = await self.host.ensure_connected(peer)
            stream = await self.host.open_stream(peer_id, protocol)
        except DialError as exc:
            return Rejection(Reason.UNREACHABLE, str(exc))
        try:
            try:
                with trio.fail_after(WRITE_TIMEOUT):
                    await write_frame(stream, payload)
            except (Exception, trio.TooSlowError) as exc:
                return Rejection(Reason.UNREACHABLE, f"could not send to {peer_id}: {type(exc).__name__}")
            try:
                frame = await read_frame(stream, max_len=max_answer, timeout=answer_timeout)
            except FrameError as exc:
                return Rejection(_ANSWER_FRAME_REASONS[exc.reason], f"answer from {peer_id}: {exc.detail}")
            except trio.Cancelled:
                if abort_frame is not None:
                    with trio.CancelScope(shield=True), trio.move_on_after(ABORT_SEND_TIMEOUT):
                        await write_frame(stream, abort_frame)
                raise
            return decode_answer(frame, expected)
        finally:
            with trio.CancelScope(shield=True):
                await _close(stream)

    async def send_offer(self, maddr_or_peer: str, offer_raw: bytes) -> DirectAnswer:
        """Offer work directly to one peer and wait for its signed result (or its refusal)."""
        answer = await self._exchange(
            maddr_or_peer,
            OFFER_PROTOCOL,
            offer_raw,
            "result",
            # The executor's own deadline plus a margin for the round trip: the server times out first.
            answer_timeout=self.result_timeout + self.stall_timeout,
            max_answer=MAX_RESULT_FRAME,
            abort_frame=pack({"type": "abort"}),
        )
        if isinstance(answer, Rejection):
            return DirectAnswer(None, answer)
        result = answer.get("result")
        if not isinstance(result, bytes):
            return DirectAnswer(None, Rejection(Reason.MALFORMED, "result answer carries no bytes"))
        return DirectAnswer(result, None)

    async def _ask(
        self, peer: str, message: dict[str, Any], expected: str, *, legacy: tuple[str, bytes], answer_timeout: float
    ) -> dict[str, Any] | Rejection:
        """One request and its answer: on our control stream to the peer, or, for a peer that does not speak it,
        on a stream of its own (`legacy`: that protocol and its request frame)."""
        answer = await self.control.request(peer, message, timeout=answer_timeout)
        if answer is None:
            protocol, payload = legacy
            return await self._exchange(
                peer, protocol, payload, expected, answer_timeout=answer_timeout, max_answer=MAX_CONTROL_FRAME
            )
        if isinstance(answer, Rejection):
            return answer
        return checked_answer(answer, expected)

    async def request_claim(self, peer: str, offer_id: bytes) -> Rejection | None:
        """Ask the offerer for the right to run `offer_id`, telling it our status (so it need not ask). None means
        granted."""
        request: dict[str, Any] = {"type": "claim", "offerId": offer_id}
        if self.status is not None:
            request["status"] = self.status()
        answer = await self._ask(
            peer, request, "grant", legacy=(CLAIM_PROTOCOL, pack(request)), answer_timeout=self.stall_timeout
        )
        return answer if isinstance(answer, Rejection) else None

    async def request_status(self, peer: str) -> dict[str, Any] | Rejection:
        """A peer's current status, straight from the peer."""
        request = {"type": "status"}
        answer = await self._ask(
            peer, request, "status", legacy=(STATUS_PROTOCOL, pack(request)), answer_timeout=self.stall_timeout
        )
        if isinstance(answer, Rejection):
            return answer
        heartbeat = answer.get("heartbeat")
        if not isinstance(heartbeat, dict):
            return Rejection(Reason.MALFORMED, "status answer carries no heartbeat")
        return heartbeat

    async def push_status(self, peer: str, status: dict[str, Any]) -> Rejection | None:
        """Tell a neighbour our status (it changed, or it is time to refresh). None means acknowledged."""
        request = {"type": "presence", "status": status}
        answer = await self._ask(
            peer, request, "ack", legacy=(PRESENCE_PROTOCOL, pack(request)), answer_timeout=self.stall_timeout
        )
        return answer if isinstance(answer, Rejection) else None

    async def send_abort(self, peer: str, offer_id: bytes) -> Rejection | None:
        """Tell a claimant that this node, the offerer, no longer waits for `offer_id`. None means it stopped it."""
        request = {"type": "abort", "offerId": offer_id}
        answer = await self._ask(
            peer, request, "ack", legacy=(ABORT_PROTOCOL, pack(request)), answer_timeout=ABORT_SEND_TIMEOUT
        )
        return answer if isinstance(answer, Rejection) else None

    async def send_result(self, peer: str, result_raw: bytes) -> Rejection | None:
        """Carry a signed result back to the offerer. None means acknowledged."""
        answer = await self._ask(
            peer,
            {"type": "result", "result": result_raw},
            "ack",
            legacy=(RESULT_PROTOCOL, result_raw),
            answer_timeout=self.stall_timeout,
        )
        return answer if isinstance(answer, Rejection) else None
